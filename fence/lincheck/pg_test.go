package lincheck

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// EnvPGRestart names a shell command that restarts the PostgreSQL of BATON_POSTGRES_URL,
// keeping its data, e.g. "BATON_STATE_DIR=/tmp/lin PG_PORT=27432 deploy/local/postgres.sh
// restart" run from the module root. Set it only for a private instance: the test restarts
// the database in the middle of the run.
const EnvPGRestart = "BATON_LINCHECK_PG_RESTART"

func pgTarget(s *pgfence.Store) *target {
	return &target{
		claim: func(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
			return s.Claim(ctx, k, t, claimant)
		},
		load: s.Load,
		apply: func(ctx context.Context, k fence.Key, t fence.Token, first, last int64) error {
			return s.Apply(ctx, k, t, first, last, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertData, k.Partition, first, last, t.Era, t.Epoch)
				return err
			})
		},
		recover: func(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant string) (fence.Token, error) {
			return s.Recover(ctx, k, expected, epoch, claimant, "lincheck")
		},
		effect: func(ctx context.Context, op opKind, err error) (outcome, bool) {
			if pgconn.SafeToRetry(err) {
				return outNoEffect, false // the request was never sent
			}
			if op == opApply && !errors.Is(err, pgfence.ErrCommitUnknown) {
				// pgfence's promise: an Apply error other than ErrCommitUnknown committed
				// nothing. The checker holds it to that.
				return outNoEffect, false
			}
			// A terminated backend or a restarted server ends the session before the
			// client sees the error: the call took effect before it returned, or never.
			// A call whose own deadline expired was abandoned by the client while the
			// server may still be running it: it may take effect later.
			return outUnknown, ctx.Err() != nil
		},
	}
}

// pgSetup returns a pool whose connections carry a unique application_name (the killer
// terminates exactly those backends) on a fresh schema, and a store migrated into it.
func pgSetup(t *testing.T) (*pgxpool.Pool, *pgfence.Store, string, string) {
	t.Helper()
	url := testenv.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema, app := testenv.UniqueName("lin"), testenv.UniqueName("lincheck")
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	_ = admin.Close(ctx)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse url: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, url); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			_ = c.Close(ctx)
		}
	})
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatalf("pgfence.New: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, createData); err != nil {
		t.Fatalf("create data table: %v", err)
	}
	return pool, s, url, app
}

// killer terminates one random backend of app every interval until ctx ends, and counts
// the backends it terminated.
func killer(ctx context.Context, url, app string, every time.Duration, killed *atomic.Int64) {
	var c *pgx.Conn
	defer func() {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if c == nil || c.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			var err error
			c, err = pgx.Connect(cctx, url)
			cancel()
			if err != nil {
				c = nil
				continue // the database is restarting
			}
		}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		var n int64
		err := c.QueryRow(qctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM (SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle' ORDER BY random() LIMIT 1) a`, app).Scan(&n)
		cancel()
		if err == nil {
			killed.Add(n)
		}
	}
}

func postmasterStart(ctx context.Context, t *testing.T, url string) time.Time {
	t.Helper()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer c.Close(ctx)
	var at time.Time
	if err := c.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&at); err != nil {
		t.Fatalf("pg_postmaster_start_time: %v", err)
	}
	return at
}

// TestPostgres: four clients through one pool, a backend of the test terminated every few
// milliseconds (statements and commits cut off mid-flight), and, when EnvPGRestart is set, the
// database restarted in the middle.
func TestPostgres(t *testing.T) {
	pool, s, url, app := pgSetup(t)
	restart := os.Getenv(EnvPGRestart)
	if restart == "" && os.Getenv("CI") != "" {
		t.Fatalf("%s is not set: CI must give this test a private PostgreSQL it may restart", EnvPGRestart)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	before := postmasterStart(ctx, t, url)
	h := newHistory()
	tgt := pgTarget(s)
	w := workload{
		keys:     []fence.Key{{Group: "g", Topic: "t", Partition: 0}, {Group: "g", Topic: "t", Partition: 1}},
		clients:  4,
		calls:    300,
		opTimout: 2 * time.Second,
		tgt:      func() *target { return tgt },
		pace:     20 * time.Millisecond,
	}
	var killed atomic.Int64
	kctx, stopKiller := context.WithCancel(ctx)
	kdone := make(chan struct{})
	go func() { defer close(kdone); killer(kctx, url, app, 40*time.Millisecond, &killed) }()
	rdone := make(chan error, 1)
	var restarted atomic.Int64 // calls recorded when the restart completed, 0 before
	if restart != "" {
		// Go on until 300 calls followed the restart.
		w.more = func() bool { n := restarted.Load(); return n == 0 || h.len() < int(n)+300 }
		go func() {
			// Restart once the run is well under way.
			for h.len() < 300 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			defer func() { restarted.Store(int64(h.len()) + 1) }()
			cmd := exec.CommandContext(ctx, "sh", "-c", restart)
			cmd.Dir = "../.."
			out, err := cmd.CombinedOutput()
			if err != nil {
				err = errors.New(err.Error() + ": " + string(out))
			}
			rdone <- err
		}()
	} else {
		t.Logf("%s is not set: no database restart in this run (connection kills only)", EnvPGRestart)
		rdone <- nil
	}
	w.run(ctx, h, uint64(time.Now().UnixNano()))
	stopKiller()
	<-kdone
	if err := <-rdone; err != nil {
		t.Fatalf("restart the database (%s): %v", restart, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the workload did not finish in time: %s", h.summary())
	}
	if restart != "" {
		if after := postmasterStart(ctx, t, url); !after.After(before) {
			t.Fatalf("the database was not restarted: postmaster started at %v, before the run at %v", after, before)
		}
	}
	if killed.Load() == 0 || h.outcomes(outUnknown)+h.outcomes(outNoEffect) == 0 {
		t.Fatalf("%d backends terminated, no call cut off: the fault did not happen (%s)", killed.Load(), h.summary())
	}
	t.Logf("%d backends terminated; database restarted after call %d", killed.Load(), restarted.Load())
	h.check(t)
	checkData(t, h, w.keys, func(part int32) ([]dataRow, error) {
		rows, err := pool.Query(ctx, selectData, part)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (dataRow, error) {
			var d dataRow
			err := r.Scan(&d.first, &d.last, &d.tok.Era, &d.tok.Epoch)
			return d, err
		})
	}, func(k fence.Key) (fence.State, error) { return s.Load(ctx, k) })
}
