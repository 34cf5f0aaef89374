package chaos_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer/chaos"
	"github.com/batonhq/baton/fence"
)

// counter counts records per key: each record adds one to its key's row.
type counter struct{ produced atomic.Int64 }

const keys = 8

func (*counter) Topics() []string { return []string{""} }

func (*counter) Migrate(ctx context.Context, env chaos.Env) error {
	return env.DB.Exec(ctx, `CREATE TABLE IF NOT EXISTS counts (k TEXT PRIMARY KEY, n BIGINT NOT NULL)`)
}

func (*counter) Consumers(context.Context, chaos.Env) ([]chaos.Consumer, func(), error) {
	count := func(ctx context.Context, tx chaos.Tx, b *chaos.Batch) error {
		for _, r := range b.Records {
			if err := tx.Exec(ctx, `INSERT INTO counts (k, n) VALUES ($1, 1)
ON CONFLICT (k) DO UPDATE SET n = counts.n + 1`, string(r.Key)); err != nil {
				return err
			}
		}
		return nil
	}
	return []chaos.Consumer{{Topics: []string{""},
		Handler: func(context.Context, fence.Key, fence.Token) (chaos.Handler, error) { return count, nil }}}, nil, nil
}

func (c *counter) Produce(ctx context.Context, env chaos.Env, cl *kgo.Client, rate int, stop <-chan struct{}) error {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := int64(0); ; i++ {
		select {
		case <-stop:
			return cl.Flush(ctx)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		r := &kgo.Record{Topic: env.Topic(""), Key: fmt.Appendf(nil, "k%d", i%keys)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			return err
		}
		c.produced.Store(i + 1)
	}
}

func (c *counter) Settled(ctx context.Context, env chaos.Env) (bool, error) {
	var n int64
	err := env.DB.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM counts`).Scan(&n)
	return n >= c.produced.Load(), err
}

func (c *counter) Check(ctx context.Context, env chaos.Env) ([]chaos.Invariant, error) {
	inv := chaos.Invariant{Name: "every record is counted once", Checked: keys}
	for k := int64(0); k < keys; k++ {
		want := c.produced.Load() / keys
		if k < c.produced.Load()%keys {
			want++
		}
		var n int64
		_ = env.DB.QueryRow(ctx, `SELECT n FROM counts WHERE k = $1`, fmt.Sprint("k", k)).Scan(&n)
		if n != want {
			inv.Violations++
			inv.Example = fmt.Sprintf("k%d counted %d times, produced %d", k, n, want)
		}
	}
	return []chaos.Invariant{inv}, nil
}

// A program's main is chaos.Main(&counter{}): it runs the harness and, re-executed as a worker,
// the worker. Here the test binary is that program (TestMain hands a worker to Main), and Run
// returns the verdict instead of exiting: an embedded Kafka, SQLite, three workers, one killed
// and one frozen past its session timeout.
func Example() {
	res, err := chaos.Run(context.Background(), &counter{},
		[]string{"-brokers=", "-postgres=", "-faults=kill,freeze", "-n=2", "-settle=45s"}, progress())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pass:", res.Pass)
	// Output: pass: true
}

// mainWorker makes the test binary a worker process when the harness runs it as one.
func mainWorker() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		chaos.Main(&counter{})
	}
}

func progress() io.Writer {
	if os.Getenv("CHAOS_PROGRESS") != "" {
		return os.Stderr
	}
	return io.Discard
}
