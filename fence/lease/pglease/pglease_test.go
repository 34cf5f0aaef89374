package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/lease/pglease"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/leasetest"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

func TestNewRejectsAllProblems(t *testing.T) {
	_, err := pglease.New(nil, pglease.TTL(time.Millisecond), nil, pglease.Table("a;b"), pglease.Era(-1), pglease.Group(""))
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"nil connection config", "TTL", "option 1 is nil", "table", "era", "group"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New error %q does not mention %q", err, want)
		}
	}
}

func TestAcquireReleaseOrder(t *testing.T) {
	src := newSource(t, testenv.PostgresURL(t))
	ctx := ctxT(t, 20*time.Second)
	res := fmt.Sprintf("order/%d", time.Now().UnixNano())
	if _, err := src.Acquire(ctx, ""); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Acquire(\"\") = %v, want ErrInvalid", err)
	}
	a, err := src.Acquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if a.Key() != lease.Key("lease:postgres", res) || a.Token().Epoch != 1 {
		t.Fatalf("lease key %v token %s, want the first counter value 1", a.Key(), a.Token())
	}
	got := make(chan *lease.Lease, 1)
	go func() {
		b, err := src.Acquire(ctx, res)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	select {
	case <-got:
		t.Fatal("a second holder acquired while the first held the lease")
	case <-time.After(300 * time.Millisecond):
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var b *lease.Lease
	select {
	case b = <-got:
	case <-ctx.Done():
		t.Fatal("the waiter did not acquire after the release")
	}
	if b == nil {
		t.FailNow()
	}
	defer b.Release(ctx)
	if b.Token().Epoch != 2 {
		t.Fatalf("second token %s, want epoch 2", b.Token())
	}
}

// terminate ends a grant from outside: what idle_session_timeout or an operator does.
func terminate(url string) func(ctx context.Context, id string) error {
	return func(ctx context.Context, id string) error {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		var ok bool
		pid, _, _ := strings.Cut(id, "/") // a grant's identity is "pid/random"
		if err := c.QueryRow(ctx, "SELECT pg_terminate_backend($1::int)", pid).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("backend %s not terminated", id)
		}
		return nil
	}
}

func TestLostWhenTerminated(t *testing.T) {
	url := testenv.PostgresURL(t)
	src := newSource(t, url)
	ctx := ctxT(t, 10*time.Second)
	l, err := src.Acquire(ctx, fmt.Sprintf("terminate-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := terminate(url)(ctx, l.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-ctx.Done():
		t.Fatal("lease context still alive after its session was terminated")
	}
	if !errors.Is(context.Cause(l.Context()), lease.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", context.Cause(l.Context()))
	}
}

func TestZombie(t *testing.T) {
	testenv.PostgresURL(t)
	leasetest.Zombie(t, "lease:postgres")
}

func TestInFlight(t *testing.T) {
	leasetest.InFlight(t, "lease:postgres", terminate(testenv.PostgresURL(t)))
}

// TestRestart stops and restarts a private PostgreSQL (deploy/local/postgres.sh with its own
// directory and port): while it is down Acquire fails with the cause and the held lease ends;
// after the restart Acquire works again and the counter continues above every earlier token.
func TestRestart(t *testing.T) {
	testenv.PostgresURL(t) // the shared server being configured says postgres.sh can run one
	script := deployScript(t, "postgres.sh")
	port := freePort(t)
	// Not t.TempDir: as root the server runs as 'postgres', which must reach the directory.
	dir, err := os.MkdirTemp("", "pglease-restart-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	env := append(os.Environ(), "PG_DIR="+filepath.Join(dir, "pg"), "PG_PORT="+port)
	run := func(cmd string) {
		t.Helper()
		c := exec.Command(script, cmd)
		c.Env = env
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("postgres.sh %s: %v\n%s", cmd, err, out)
		}
	}
	run("start")
	t.Cleanup(func() { run("reset") })
	src := newSource(t, "postgres://baton:baton@127.0.0.1:"+port+"/baton?sslmode=disable")
	ctx := ctxT(t, 60*time.Second)
	first, err := src.Acquire(ctx, "restart")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)

	run("stop")
	down, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = src.Acquire(down, "other")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("Acquire while PostgreSQL is down = %v, want the connection error", err)
	}
	t.Logf("while down: %v", err)
	select {
	case <-first.Context().Done():
		t.Logf("held lease ended: %v", context.Cause(first.Context()))
	case <-time.After(3 * testTTL):
		t.Fatal("the held lease's context did not end while PostgreSQL was down")
	}

	run("start")
	again, err := src.Acquire(ctxT(t, 20*time.Second), "restart")
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	defer again.Release(ctx)
	if first.Token().Compare(again.Token()) >= 0 {
		t.Fatalf("token after restart %s not above %s", again.Token(), first.Token())
	}
}

func deployScript(t *testing.T, name string) string {
	t.Helper()
	// go test runs a package's tests in its directory (also in a binary built with -trimpath,
	// where the source file's own path is not absolute).
	p, err := filepath.Abs(filepath.Join("..", "..", "..", "deploy", "local", name))
	if err != nil {
		t.Fatalf("deploy script: %v", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("deploy script: %v", err)
	}
	return p
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func BenchmarkAcquireRelease(b *testing.B) {
	src := newSource(b, testenv.PostgresURL(b))
	ctx := ctxT(b, 5*time.Minute)
	res := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	for b.Loop() {
		l, err := src.Acquire(ctx, res)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestHeldPastTTL: a live holder's pings keep its session, and the lock, past the TTL.
func TestHeldPastTTL(t *testing.T) {
	src := newSource(t, testenv.PostgresURL(t))
	ctx := ctxT(t, 20*time.Second)
	res := fmt.Sprintf("held-%d", time.Now().UnixNano())
	l, err := src.Acquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	select {
	case <-l.Context().Done():
		t.Fatalf("lease ended while its holder was alive: %v", context.Cause(l.Context()))
	case <-time.After(testTTL * 5 / 2):
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := src.Acquire(short, res); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second Acquire while the first holds = %v, want it to wait until its deadline", err)
	}
}

// A restore (or a promoted replica without the last commits) moves the counter back, and the
// next Acquire re-issues a token a holder already had. The two grants of that token must be
// two claimants, so that at most one of them holds it at the sink: the first claims it, the
// second is refused as stale (equal token, another claimant) and must be recovered into a new
// era by an operator. Simulated by moving the counter row back between the two grants.
// (The identity's uniqueness for one backend pid, which a restore repeats:
// TestGrantIDUniqueForOnePid.)
func TestTwoGrantsOfOneTokenAfterARestore(t *testing.T) {
	url := testenv.PostgresURL(t)
	src := newSource(t, url)
	ctx := ctxT(t, 30*time.Second)
	res := fmt.Sprintf("restore-%d", time.Now().UnixNano())
	earlier, err := src.Acquire(ctx, res) // token 1: the counter can go back from the next
	if err != nil {
		t.Fatal(err)
	}
	if err := earlier.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := src.Acquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Claim(ctx, fence.Sink[*memfence.Tx](sink), first); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `UPDATE baton_lease_counters SET counter = counter - 1 WHERE grp = $1 AND resource = $2`, "lease:postgres", res); err != nil {
		t.Fatal(err)
	}
	second, err := src.Acquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if first.Token() != second.Token() {
		t.Fatalf("tokens %s and %s: the restore did not re-issue the token", first.Token(), second.Token())
	}
	if first.ID() == second.ID() {
		t.Fatalf("both grants of token %s are %q: two holders of one token would be one claimant", first.Token(), first.ID())
	}
	var se *fence.StaleError
	if _, err := lease.Claim(ctx, fence.Sink[*memfence.Tx](sink), second); !errors.As(err, &se) {
		t.Fatalf("the second grant of token %s claimed the first's fence: %v, want a *fence.StaleError", second.Token(), err)
	}
}
