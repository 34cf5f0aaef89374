package leasetest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/pgfence"
)

// replyTimeout bounds the wait for one helper reply: a helper's own commands are bounded by
// opTimeout, so a reply later than this means a hung or frozen helper.
var replyTimeout = opTimeout + 5*time.Second

// sinkEnv creates the sink's storage for one test and returns the helpers' environment and
// the parent's own view of the sink.
func sinkEnv(t *testing.T) ([]string, target, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := os.Getenv(envPostgres)
	if url == "" {
		path := filepath.Join(t.TempDir(), "lease.db")
		tg, err := openTarget(ctx, "", path)
		if err != nil {
			t.Fatalf("open SQLite sink: %v", err)
		}
		t.Cleanup(tg.close)
		return []string{envSQLite + "=" + path}, tg, "SQLite " + path
	}
	schema := fmt.Sprintf("leasetest_%d_%d", os.Getpid(), time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", envPostgres, err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Logf("drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgfence.New(pool)
	if err == nil {
		err = s.Migrate(ctx)
	}
	if err == nil {
		_, err = pool.Exec(ctx, pgData)
	}
	pool.Close()
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	tg, err := openTarget(ctx, schema, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.close)
	return []string{envPGSchema + "=" + schema}, tg, "PostgreSQL schema " + schema
}

// proc is one helper process.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	in     *os.File
	lines  chan string
	mu     sync.Mutex
	stderr bytes.Buffer
	frozen bool
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.Write(b)
}

// spawn starts a helper: this test binary, running no test, with the suite's environment.
func spawn(t *testing.T, name string, env []string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, lines: make(chan string, 16)}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(append(os.Environ(), envChild+"=1"), env...)
	p.cmd.Stderr = p
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdin = pr
	p.in = pw
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start helper %s: %v", name, err)
	}
	_ = pr.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if p.frozen {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = p.in.Close() // the helper releases its lease and exits at EOF
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		_ = p.cmd.Wait()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("helper %s stderr:\n%s", name, p.stderr.String())
			p.mu.Unlock()
		}
	})
	return p
}

// recv waits for the helper's next line.
func (p *proc) recv() string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("helper %s exited", p.name)
		}
		p.t.Logf("%s: %s", p.name, l)
		return l
	case <-time.After(replyTimeout):
		p.t.Fatalf("helper %s: no reply within %s", p.name, replyTimeout)
	}
	return ""
}

// do sends one command and returns its reply line.
func (p *proc) do(cmd string) string {
	p.t.Helper()
	p.t.Logf("-> %s: %s", p.name, cmd)
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		p.t.Fatalf("helper %s: send %q: %v", p.name, cmd, err)
	}
	return p.recv()
}

// ok sends cmd and fails the test unless it succeeded; it returns the fields after "ok".
func (p *proc) ok(cmd string) []string {
	p.t.Helper()
	r := p.do(cmd)
	f := strings.Fields(r)
	if len(f) == 0 || f[0] != "ok" {
		p.t.Fatalf("helper %s: %s = %q, want ok", p.name, cmd, r)
	}
	return f[1:]
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
	p.frozen = sig == syscall.SIGSTOP
}

// acquire makes p acquire resource and returns its token and grant id.
func (p *proc) acquire(resource string) (fence.Token, string) {
	p.t.Helper()
	f := p.ok("acquire " + resource)
	if len(f) != 2 {
		p.t.Fatalf("helper %s: acquire reply %v", p.name, f)
	}
	tok, err := fence.ParseToken(f[0])
	if err != nil {
		p.t.Fatal(err)
	}
	return tok, f[1]
}

func resourceName(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

func checkState(t *testing.T, tg target, k fence.Key, resource, value string, tok fence.Token, pos int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := tg.value(ctx, resource)
	if err != nil || v != value {
		t.Fatalf("lease_data[%s] = %q, %v; want %q", resource, v, err, value)
	}
	st, err := tg.load(ctx, k)
	if err != nil || st.Token != tok || st.Position != pos {
		t.Fatalf("fence %s = %+v, %v; want token %s position %d", k, st, err, tok, pos)
	}
}

// Zombie runs the frozen-holder case (see the package doc). group is the source's fence group.
func Zombie(t *testing.T, group string) {
	env, tg, where := sinkEnv(t)
	t.Logf("sink: %s", where)
	res := resourceName(t)
	k := lease.Key(group, res)
	a, b := spawn(t, "A", env), spawn(t, "B", env)

	tokA, _ := a.acquire(res)
	if got := a.ok("claim"); got[0] != "-1" {
		t.Fatalf("A claims at position %v, want -1 (nothing applied)", got)
	}
	a.ok("write 1 a1")

	a.signal(syscall.SIGSTOP)
	start := time.Now()
	tokB, _ := b.acquire(res) // only once the service has expired A's grant
	t.Logf("B acquired %s after A was frozen for %s", tokB, time.Since(start).Round(time.Millisecond))
	if tokA.Compare(tokB) >= 0 {
		t.Fatalf("B's token %s is not above A's %s", tokB, tokA)
	}
	if got := b.ok("claim"); got[0] != "1" {
		t.Fatalf("B claims at position %v, want 1", got)
	}
	b.ok("write 2 b2")
	a.signal(syscall.SIGCONT)

	// A wakes up and writes under its old token, as code paused after its lease check would.
	if r := a.do("raw 3 a3"); !strings.HasPrefix(r, "attempt ") || !strings.Contains(r, tokA.String()) {
		t.Fatalf("A did not report its attempt: %q", r)
	}
	want := fmt.Sprintf("err stale stored=%s presented=%s ", tokB, tokA)
	if r := a.recv(); !strings.HasPrefix(r, want) {
		t.Fatalf("A's zombie write: %q, want prefix %q (the sink must refuse it, naming B's token)", r, want)
	}
	// Through lease.Apply the write fails too, stale or (if A noticed already) lost.
	if r := a.do("write 3 a3"); !strings.HasPrefix(r, "err ") || !(strings.HasPrefix(r, "err stale") || strings.Contains(r, "lost=true")) {
		t.Fatalf("A's lease.Apply after waking: %q, want stale or lost", r)
	}
	a.ok("waitlost") // and A learns it lost the lease
	checkState(t, tg, k, res, "b2", tokB, 2)
	b.ok("write 3 b3") // B is unaffected
	checkState(t, tg, k, res, "b3", tokB, 3)
}

// InFlight runs the lease-lost-during-a-write case (see the package doc).
func InFlight(t *testing.T, group string, kill func(ctx context.Context, id string) error) {
	env, tg, where := sinkEnv(t)
	t.Logf("sink: %s", where)
	res := resourceName(t)
	k := lease.Key(group, res)
	a, b := spawn(t, "A", env), spawn(t, "B", env)

	tokA, idA := a.acquire(res)
	a.ok("claim")
	a.ok("write 1 a1")
	if r := a.do("hold 2 a2"); r != "infn" {
		t.Fatalf("A: hold = %q, want infn", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := kill(ctx, idA); err != nil {
		t.Fatalf("end A's grant %s: %v", idA, err)
	}
	if r := a.recv(); !strings.HasPrefix(r, "err ") || !strings.Contains(r, "lost=true") {
		t.Fatalf("A's in-flight write: %q, want an error wrapping lease.ErrLost", r)
	}
	checkState(t, tg, k, res, "a1", tokA, 1)
	tokB, _ := b.acquire(res)
	if tokA.Compare(tokB) >= 0 {
		t.Fatalf("B's token %s is not above A's %s", tokB, tokA)
	}
	b.ok("claim")
	b.ok("write 2 b2")
	checkState(t, tg, k, res, "b2", tokB, 2)
	if r := a.do("raw 3 a3"); !strings.HasPrefix(r, "attempt ") {
		t.Fatalf("A: %q", r)
	}
	if r := a.recv(); !strings.HasPrefix(r, "err stale stored="+tokB.String()) {
		t.Fatalf("A's late write: %q, want stale", r)
	}
	checkState(t, tg, k, res, "b2", tokB, 2)
}
