package pglease

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
	"github.com/batonhq/baton/internal/pgmigrate"
)

// Source grants leases with PostgreSQL session advisory locks: each [Source.Acquire] opens its
// own session, takes pg_advisory_lock on the resource, and then, still holding it, increments
// the resource's row in the counter table; the new counter value is the token. Safe for
// concurrent use.
type Source struct {
	conn *pgx.ConnConfig
	cfg  config
	sql  struct{ schema, next string }
}

var _ lease.Source = (*Source)(nil)

// New returns a source whose sessions connect with connConfig (a copy is kept; all of pgx's
// settings, TLS included, apply). A nil config, a nil option or an invalid option value fails
// with errors wrapping [fence.ErrInvalid], all of them joined. Call [Source.Migrate] once
// before the first Acquire.
func New(connConfig *pgx.ConnConfig, opts ...Option) (*Source, error) {
	cfg := config{ttl: defaultTTL, table: defaultTable, group: defaultGroup}
	var errs []error
	if connConfig == nil {
		errs = append(errs, fmt.Errorf("%w: pglease: nil connection config", fence.ErrInvalid))
	}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: pglease: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s := &Source{conn: connConfig.Copy(), cfg: cfg}
	t := pgx.Identifier(strings.Split(cfg.table, ".")).Sanitize()
	s.sql.schema = `CREATE TABLE IF NOT EXISTS ` + t + ` (
	grp      text   NOT NULL,
	resource text   NOT NULL,
	counter  bigint NOT NULL CHECK (counter > 0),
	PRIMARY KEY (grp, resource)
)`
	s.sql.next = `INSERT INTO ` + t + ` AS c (grp, resource, counter) VALUES ($1, $2, 1)
ON CONFLICT (grp, resource) DO UPDATE SET counter = c.counter + 1
RETURNING counter`
	return s, nil
}

// Migrate creates the counter table if it does not exist. It is safe to run concurrently.
func (s *Source) Migrate(ctx context.Context) error {
	c, err := pgx.ConnectConfig(ctx, s.conn)
	if err != nil {
		return fmt.Errorf("pglease: migrate: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	return pgmigrate.Run(ctx, c, "baton/pglease/migrate", s.sql.schema, "pglease: migrate")
}

// lockKey is the advisory lock key of a resource in a group (see the package doc).
func lockKey(group, resource string) int64 {
	return pgmigrate.LockID("baton/pglease/" + group + "\x00" + resource)
}

// Acquire blocks until the caller holds resource or ctx ends. It connects (an unreachable
// server fails here, with pgx's error), sets idle_session_timeout to the TTL, waits for the
// advisory lock, and increments the counter row in autocommit, so the increment is committed
// before the token is handed out. The lease's context ends when a ping fails: the session was
// terminated (idle past the TTL, pg_terminate_backend, a server restart) or the connection
// broke. Release closes the session, which frees the lock.
func (s *Source) Acquire(ctx context.Context, resource string) (*lease.Lease, error) {
	k := lease.Key(s.cfg.group, resource)
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, fmt.Errorf("pglease: resource: %w", err)
	}
	fail := func(what string, err error) (*lease.Lease, error) {
		return nil, fmt.Errorf("pglease: acquire %q: %s: %w", resource, what, err)
	}
	c, err := pgx.ConnectConfig(ctx, s.conn)
	if err != nil {
		return fail("connect", err)
	}
	abort := func(what string, err error) (*lease.Lease, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = c.Close(cctx)
		return fail(what, err)
	}
	ttl := strconv.FormatInt(s.cfg.ttl.Milliseconds(), 10)
	if _, err := c.Exec(ctx, "SELECT set_config('idle_session_timeout', $1, false)", ttl); err != nil {
		return abort("set idle_session_timeout (PostgreSQL 14 or later)", err)
	}
	if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey(s.cfg.group, resource)); err != nil {
		return abort("wait for the advisory lock", err)
	}
	var n int64
	if err := c.QueryRow(ctx, s.sql.next, s.cfg.group, resource).Scan(&n); err != nil {
		return abort("increment the counter", err)
	}
	id := grantID(c.PgConn().PID())
	h := &heartbeat{c: c, every: s.cfg.ttl / 3, stop: make(chan struct{}), done: make(chan struct{})}
	l, lost, err := lease.Grant(k, fence.Token{Era: s.cfg.era, Epoch: n}, id, h.release)
	if err != nil {
		return abort("grant", err)
	}
	h.lost = lost
	go h.run()
	return l, nil
}

// grantID is a grant's identity, the claimant the sink stores with its token: the session's
// backend pid (for operators: pg_stat_activity, pg_locks) and 128 random bits. The claimant keeps
// two holders of one token apart when the counter goes backwards, and that is a restore or a
// promoted replica, exactly when backend pids restart and repeat: the pid alone would make a
// holder with pid 4242 and token 17 on the old primary and one with pid 4242 and the re-issued
// token 17 on the new one the same claimant, both holding the token.
func grantID(pid uint32) string {
	return strconv.FormatUint(uint64(pid), 10) + "/" + rand.Text()
}

// heartbeat owns the lease's session after Acquire: it pings it every TTL/3 (which keeps
// idle_session_timeout from firing) and reports the first failure as the loss of the lease.
type heartbeat struct {
	c     *pgx.Conn
	every time.Duration
	lost  func(error)
	stop  chan struct{}
	done  chan struct{}
}

func (h *heartbeat) run() {
	defer close(h.done)
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.every)
		err := h.c.Ping(ctx)
		cancel()
		if err != nil {
			h.lost(fmt.Errorf("postgresql session %d: %w", h.c.PgConn().PID(), err))
			// A ping that timed out may have left the session, and the lock, alive: close it
			// so that a successor need not wait for idle_session_timeout.
			ctx, cancel := context.WithTimeout(context.Background(), h.every)
			_ = h.c.Close(ctx)
			cancel()
			return
		}
	}
}

// release stops the heartbeat and closes the session; PostgreSQL frees the lock with it.
func (h *heartbeat) release(ctx context.Context) error {
	close(h.stop)
	<-h.done
	return h.c.Close(ctx)
}
