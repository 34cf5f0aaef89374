package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/batonhq/baton/fence"
	fencelease "github.com/batonhq/baton/fence/lease" // "lease" is the example's TTL constant
	"github.com/batonhq/baton/fence/lease/etcdlease"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// envEtcd names the etcd step 1 runs against; deploy/local/etcd.sh env prints it.
const envEtcd = "BATON_ETCD_ENDPOINTS"

// etcdTTL is step 1's lease: etcd's minimum TTL with its default timings.
const etcdTTL = 2 * time.Second

// errNoEtcd means step 1 with etcd was skipped because no etcd was configured.
var errNoEtcd = errors.New(envEtcd + " is not set")

// Step 1 with Redis: there is no token to fence with.
func redisStep1(out *syncWriter) {
	out.say("")
	out.say("(1) step 1 with the Redis lock: not possible. SET key value NX PX ttl hands the holder a random value, not an ordered token:")
	out.say("    the database cannot tell worker-1's value from worker-2's, so there is nothing to fence the writes with. Go straight")
	out.say("    to step 2, or move the lock to etcd, ZooKeeper or PostgreSQL first (fence/lease) and do step 1 there.")
}

// Step 1 with etcd: keep the lock, fence the writes with its token.
//
// The job is the lock version's, with two changes: after taking the lock, the worker claims
// the lock's token in the database (lease.Claim), and it writes through lease.Apply, which
// checks and advances that token in the write's transaction. The read stays where it was.
func withEtcd(ctx context.Context, out *syncWriter, path string) (int64, error) {
	out.say("")
	v := os.Getenv(envEtcd)
	if v == "" {
		out.say("(1) step 1 with etcd: %s is not set: SKIPPED (start etcd with deploy/local/etcd.sh start and export what deploy/local/etcd.sh env prints)", envEtcd)
		return 0, errNoEtcd
	}
	endpoints := strings.Split(v, ",")
	out.say("(1) step 1 with etcd: keep the lock, fence the writes with its token (etcd at %s), lease %s, SQLite", v, etcdTTL)
	store, err := openAccounts(path)
	if err != nil {
		return 0, err
	}
	defer store.Close()

	// worker-1 reaches etcd through connections that a pause silences: a paused process sends
	// no keep-alives, so etcd expires its lease and hands the lock on.
	freeze := newFreezer()
	proxied, stopProxies, err := proxyAll(endpoints, freeze)
	if err != nil {
		return 0, err
	}
	defer stopProxies()
	src1, close1, err := etcdSource(proxied)
	if err != nil {
		return 0, err
	}
	defer close1()
	src2, close2, err := etcdSource(endpoints)
	if err != nil {
		return 0, err
	}
	defer close2()

	resource := account + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	gate := newGate[*sql.Tx](store) // holds worker-1's write after lease.Apply's own check
	gate.arm()
	// First (defers run last in first out): thaw before the proxies and clients close, since
	// they wait for reads a freeze blocks, and let a held write go.
	defer func() { freeze.thaw(); gate.open() }()
	done := make(chan error, 1)
	go func() { done <- fencedDeposit(ctx, out, "etcd", src1, gate, store, resource, "worker-1", first) }()
	select {
	case <-gate.held:
	case err := <-done:
		return 0, fmt.Errorf("worker-1 did not reach its write: %v", err)
	}
	freeze.freeze()
	out.say("[etcd] worker-1 pauses before its write, past its %s lease; its keep-alives stop, etcd expires its lease", etcdTTL)

	if err := fencedDeposit(ctx, out, "etcd", src2, store, store, resource, "worker-2", second); err != nil {
		return 0, err
	}
	// The process resumes: its connections and its held write at once.
	out.say("[etcd] worker-1 resumes, still believing it holds the lock, and writes")
	freeze.thaw()
	gate.open()
	err = <-done
	if !errors.Is(err, fence.ErrStale) {
		return 0, fmt.Errorf("the zombie's write returned %v, want a stale refusal", err)
	}
	out.say("[etcd] zombie write refused: stale token (%v)", staleOnly(err))

	// The refusal is an error the job sees: it runs again, under a new lease.
	out.say("[etcd] worker-1's job failed loudly instead of overwriting; it runs again")
	if err := fencedDeposit(ctx, out, "etcd", src1, store, store, resource, "worker-1", first); err != nil {
		return 0, err
	}
	return balanceOf(ctx, store.DB())
}

// fencedDeposit is step 1's job: take the lock, claim its token in the database, read,
// compute, and write through lease.Apply. sink is where the writes go (worker-1's first run
// goes through the gate that pauses it).
func fencedDeposit(ctx context.Context, out *syncWriter, tag string, src fencelease.Source, sink fence.Sink[*sql.Tx], store *sqlitefence.Store, resource, worker string, amount int64) error {
	l, err := src.Acquire(ctx, resource) // 1. take the lock (waits while someone holds it)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = l.Release(rctx) // also after a loss: it frees the session
	}()
	st, err := fencelease.Claim(ctx, sink, l) // 2. instead of checking the lock: claim its token
	if err != nil {
		return err
	}
	var balance int64 // 3. read, as before
	if err := store.DB().QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, account).Scan(&balance); err != nil {
		return err
	}
	out.say("[%s] %s holds the lock with token %s, claimed it in the database, read balance %d", tag, worker, l.Token(), balance)
	// 4. write what it computed, through the fence: refused if a later token has claimed.
	err = fencelease.Apply(ctx, sink, l, st.Position+1, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, balance+amount, account)
		return err
	})
	if err != nil {
		return err
	}
	out.say("[%s] %s wrote %d + %d = %d under token %s", tag, worker, balance, amount, balance+amount, l.Token())
	return nil
}

// staleOnly returns the *fence.StaleError in err's chain (the lease's own loss, which
// lease.Apply adds, is beside the point here).
func staleOnly(err error) error {
	var se *fence.StaleError
	if errors.As(err, &se) {
		return se
	}
	return err
}

func etcdSource(endpoints []string) (*etcdlease.Source, func(), error) {
	cl, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, fmt.Errorf("etcd at %v: %w", endpoints, err)
	}
	src, err := etcdlease.New(cl, etcdlease.TTL(etcdTTL), etcdlease.Prefix("/baton/examples/lock-to-partition/"))
	if err != nil {
		_ = cl.Close()
		return nil, nil, err
	}
	return src, func() { _ = cl.Close() }, nil
}

// proxyAll starts a local TCP proxy per endpoint whose upstream connections f can freeze, and
// returns the proxies' addresses; stop closes them and waits for their goroutines.
func proxyAll(endpoints []string, f *freezer) ([]string, func(), error) {
	var stops []func()
	stopAll := func() {
		for _, s := range stops {
			s()
		}
	}
	var addrs []string
	for _, ep := range endpoints {
		addr, stop, err := proxy(strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"), f)
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		addrs, stops = append(addrs, addr), append(stops, stop)
	}
	return addrs, stopAll, nil
}

func proxy(upstream string, f *freezer) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }
	wg.Go(func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := f.dial(context.Background(), "tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			track(down)
			track(up)
			for _, p := range [][2]net.Conn{{up, down}, {down, up}} {
				wg.Go(func() {
					_, _ = io.Copy(p[0], p[1])
					p[0].Close()
					p[1].Close()
				})
			}
		}
	})
	stop := func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
	return ln.Addr().String(), stop, nil
}
