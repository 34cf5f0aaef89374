package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

const (
	account          = "acct-42"
	opening          = 100
	first, second    = 30, 50 // the paused worker's deposit, then its successor's
	want             = opening + first + second
	lease            = time.Second // (a): the lock's TTL; step 2: the consumer-group session
	sessionHeartbeat = lease / 10
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lock-to-partition:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer) error {
	out := &syncWriter{w: w}
	dir, err := os.MkdirTemp("", "lock-to-partition-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	lockBalance, err := withLock(ctx, out, filepath.Join(dir, "lock.db"))
	if err != nil {
		return fmt.Errorf("lock version: %w", err)
	}
	redisStep1(out)
	etcdBalance, err := withEtcd(ctx, out, filepath.Join(dir, "etcd.db"))
	if err != nil && !errors.Is(err, errNoEtcd) {
		return fmt.Errorf("step 1 with etcd: %w", err)
	}
	etcdRan := err == nil
	batonBalance, err := withBaton(ctx, out, filepath.Join(dir, "baton.db"))
	if err != nil {
		return fmt.Errorf("baton version: %w", err)
	}
	out.say("")
	out.say("verdict: redis lock: balance %d, expected %d (%s); baton: balance %d, expected %d (%s)",
		lockBalance, want, judge(lockBalance), batonBalance, want, judge(batonBalance))
	if etcdRan {
		out.say("verdict: step 1, etcd lock + fenced writes: balance %d, expected %d (%s)", etcdBalance, want, judge(etcdBalance))
	} else {
		out.say("verdict: step 1, etcd lock + fenced writes: not run (%s is not set)", envEtcd)
	}
	if batonBalance != want {
		return errors.New("baton lost or doubled an update")
	}
	if etcdRan && etcdBalance != want {
		return errors.New("step 1 with etcd lost or doubled an update")
	}
	if lockBalance == want {
		return errors.New("the fault did not bite the lock version: it proved nothing")
	}
	return nil
}

func judge(balance int64) string {
	if balance == want {
		return "correct"
	}
	return "LOST UPDATE"
}

// (a) The usual way: take a lease lock per account, check it, read, compute, write.

// Locker is what the job needs from the lock; redisLock (the naive Redis lock, redislock.go)
// implements it, and so does the in-process stand-in memLock.
type Locker interface {
	TryAcquire(ctx context.Context, key, value string, ttl time.Duration) (bool, error)
	Get(ctx context.Context, key string) (string, bool, error)
	Release(ctx context.Context, key, value string) error
}

func deposit(ctx context.Context, out *syncWriter, locks Locker, db *sql.DB, key, worker string, amount int64, pause func()) error {
	for { // 1. take the lock, waiting while someone else holds it
		ok, err := locks.TryAcquire(ctx, key, worker, lease)
		if err != nil {
			return err
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if v, held, err := locks.Get(ctx, key); err != nil || !held || v != worker { // 2. check it
		return fmt.Errorf("%s lost the lock before writing (%v)", worker, err)
	}
	var balance int64 // 3. read
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, account).Scan(&balance); err != nil {
		return err
	}
	out.say("[lock] %s holds the lock, checked it, read balance %d", worker, balance)
	pause() // the fault: a GC pause, a frozen VM, a slow network, after the check
	// 4. write what it computed from what it read
	if _, err := db.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, balance+amount, account); err != nil {
		return err
	}
	out.say("[lock] %s wrote %d + %d = %d", worker, balance, amount, balance+amount)
	if err := locks.Release(ctx, key, worker); err != nil {
		out.say("[lock] %s: release failed (%v): it learns of the expiry only after its write", worker, err)
	}
	return nil
}

func withLock(ctx context.Context, out *syncWriter, path string) (int64, error) {
	var locks Locker
	if addr := os.Getenv("BATON_REDIS_ADDR"); addr != "" {
		c, err := dialRedisLock(ctx, addr)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		locks = c
		out.say("(a) before: the Redis lock (Redis at %s), lease %s", addr, lease)
	} else {
		locks = newMemLock()
		out.say("(a) before: the Redis lock, lease %s; BATON_REDIS_ADDR is not set: using an IN-PROCESS STAND-IN for Redis (keys expire like Redis's)", lease)
	}
	db, err := openAccounts(path)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	key := "lock-to-partition/" + account + "/" + strconv.FormatInt(time.Now().UnixNano(), 10)

	paused, resume := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- deposit(ctx, out, locks, db.DB(), key, "worker-1", first, func() {
			close(paused)
			<-resume
		})
	}()
	<-paused
	out.say("[lock] worker-1 pauses before its write, past its %s lease; its lock expires", lease)
	if err := deposit(ctx, out, locks, db.DB(), key, "worker-2", second, func() {}); err != nil {
		close(resume)
		<-done
		return 0, err
	}
	out.say("[lock] worker-1 resumes, still believing it holds the lock")
	close(resume)
	if err := <-done; err != nil {
		return 0, err
	}
	return balanceOf(ctx, db.DB())
}

// Step 2, with Baton: the partition is the lock, the group generation the token, the database
// the place where the token is checked. There is no lock, no lease and no renewal.

func withBaton(ctx context.Context, out *syncWriter, path string) (int64, error) {
	out.say("")
	out.say("(2) step 2, Baton: the partition is the lock; session timeout %s; embedded Kafka (kfake) and SQLite", lease)
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "deposits"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	if err != nil {
		return 0, err
	}
	defer kafka.Close()
	store, err := openAccounts(path)
	if err != nil {
		return 0, err
	}
	defer store.Close()
	defer out.setQuiet(false) // after the members below stopped

	// The job, unchanged but for the lock: read, compute, write, inside the fenced transaction.
	handler := func(name string) consumer.Factory[*sql.Tx] {
		return func(_ context.Context, k fence.Key, t fence.Token) (consumer.Handler[*sql.Tx], error) {
			out.say("[baton] member %s owns partition %d with token %s", name, k.Partition, t)
			return consumer.Handler[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
				for _, r := range b.Records {
					amount, err := strconv.ParseInt(string(r.Value), 10, 64)
					if err != nil {
						return fmt.Errorf("deposit %q at offset %d: %w", r.Value, r.Offset, err)
					}
					var balance int64
					if err := tx.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, string(r.Key)).Scan(&balance); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, balance+amount, string(r.Key)); err != nil {
						return err
					}
					out.say("[baton] member %s wrote %d + %d = %d under token %s", name, balance, amount, balance+amount, b.Token)
				}
				return nil
			}), nil
		}
	}
	brokers := kafka.ListenAddrs()
	gate := newGate[*sql.Tx](store)
	freeze := newFreezer()
	a, err := startMember(ctx, brokers, gate, handler("A"), kgo.Dialer(freeze.dial))
	if err != nil {
		return 0, err
	}
	// Let A's held write go (if it still waits) and unfreeze it before stopping it: a member
	// stops only after its in-flight batch has finished.
	defer func() { gate.open(); freeze.thaw(); a.stop() }()
	gate.arm()
	if err := produce(ctx, brokers, first); err != nil {
		return 0, err
	}
	select {
	case <-gate.held:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	freeze.freeze()
	out.say("[baton] member A fetched the deposit of %d and pauses before its write, past its %s session", first, lease)

	b, err := startMember(ctx, brokers, store, handler("B"))
	if err != nil {
		return 0, err
	}
	defer b.stop()
	defer out.setQuiet(true) // the members' shutdown rebalances are not part of the story
	if err := produce(ctx, brokers, second); err != nil {
		return 0, err
	}
	if err := waitFor(ctx, func() bool { n, err := balanceOf(ctx, store.DB()); return err == nil && n >= want }); err != nil {
		return 0, fmt.Errorf("waiting for B to take over: %w", err)
	}
	out.say("[baton] member A resumes, still believing it owns partition 0, and writes")
	if err := gate.release(); errors.Is(err, fence.ErrStale) {
		out.say("[baton] zombie write refused: stale token (%v)", err)
	} else {
		return 0, fmt.Errorf("the zombie's write returned %v, want a stale refusal", err)
	}
	return balanceOf(ctx, store.DB())
}

func openAccounts(path string) (*sqlitefence.Store, error) {
	s, err := sqlitefence.Open(path)
	if err != nil {
		return nil, err
	}
	if _, err := s.DB().Exec(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
INSERT INTO accounts VALUES (?, ?)`, account, opening); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func balanceOf(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, account).Scan(&n)
	return n, err
}

func produce(ctx context.Context, brokers []string, amount int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, &kgo.Record{Topic: "deposits", Key: []byte(account), Value: []byte(strconv.FormatInt(amount, 10))}).FirstErr()
}
