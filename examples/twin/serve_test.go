package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/batonhq/baton/consumer"
)

// TestExampleRealServices is the demo on the real broker and PostgreSQL (skipped without them,
// required in CI): the same story and the same verdict, read from the database.
func TestExampleRealServices(t *testing.T) {
	brokers, pgURL := kafkaBrokers(t), postgresURL(t)
	args := []string{"-brokers", strings.Join(brokers, ","), "-postgres", pgURL, "-session-timeout", "2s"}
	runStory(t, args, func(out string) {
		if m := regexp.MustCompile(`schema (twin_[0-9a-f]+)`).FindStringSubmatch(out); m != nil {
			dropSchema(t, pgURL, m[1])
		}
	}, "store: PostgreSQL, schema twin_")
}

func dropSchema(t *testing.T, pgURL, schema string) {
	pool, _, err := openPostgres(context.Background(), pgURL, false)
	if err != nil {
		t.Logf("drop schema %s: %v", schema, err)
		return
	}
	defer pool.close()
	if err := pool.db.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		t.Logf("drop schema %s: %v", schema, err)
	}
}

// memberMetrics reads the metrics the README promises a member serves once it has processed
// records (the list under "Metrics of a member").
func memberMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "Metrics of a member")
	if !ok {
		t.Fatal(`README.md has no "Metrics of a member"`)
	}
	sec, _, _ = strings.Cut(sec, "\n\n\n")
	var names []string
	for _, m := range regexp.MustCompile("(?m)^- `(baton_[a-z_]+)`").FindAllStringSubmatch(sec, -1) {
		names = append(names, m[1])
	}
	if len(names) < 5 {
		t.Fatalf("README.md lists %d member metrics: %q", len(names), names)
	}
	return names
}

// TestServeRealServices runs the member program as a deployment does: -migrate into a fresh
// schema, then -serve on the real broker and PostgreSQL; waits for /readyz to answer 200,
// feeds it the devices' updates, checks the twins in the database, scrapes /metrics for every
// metric the README lists, and stops it as SIGTERM does (Run returns nil).
func TestServeRealServices(t *testing.T) {
	pgURL := withSearchPath(postgresURL(t), freshSchema(t, postgresURL(t), nil))
	serveMember(t, []string{"-postgres", pgURL}, pgURL, pgDB{pool(t, pgURL)})
}

// TestServeLeastPrivilege is the deployment's split of rights on the TLS-only PostgreSQL:
// -migrate runs as the migration role and grants -app-role; the member then runs as that
// runtime role, which holds no DDL right (skipped without the secure services, run in CI).
func TestServeLeastPrivilege(t *testing.T) {
	kafkaBrokers(t)
	const hint = "start them with 'BATON_SECURE=1 make up' and export what 'BATON_SECURE=1 make env' prints"
	rtURL := service(t, "BATON_SECURE_POSTGRES_URL", hint)        // the runtime role, TLS verify-full
	admURL := service(t, "BATON_SECURE_POSTGRES_ADMIN_URL", hint) // the migration role
	cfg, err := pgx.ParseConfig(rtURL)
	if err != nil {
		t.Fatal(err)
	}
	role := cfg.User
	schema := freshSchema(t, admURL, func(s string) string { return "GRANT USAGE ON SCHEMA " + s + " TO " + pgx.Identifier{role}.Sanitize() })
	serveMember(t, []string{"-postgres", withSearchPath(admURL, schema), "-app-role", role},
		withSearchPath(rtURL, schema), pgDB{pool(t, withSearchPath(admURL, schema))})
	// The runtime role could not have created the tables itself.
	if _, err := pool(t, withSearchPath(rtURL, schema)).Exec(context.Background(), "CREATE TABLE runtime_ddl (x int)"); err == nil {
		t.Error("the runtime role may create tables: the least privilege is not least")
	}
}

// serveMember runs -migrate with migrateArgs, then a member on pgURL, and checks it as
// TestServeRealServices says, reading the database through db.
func serveMember(t *testing.T, migrateArgs []string, pgURL string, db sqlDB) {
	brokers := kafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var mout bytes.Buffer
	if err := run(ctx, append([]string{"-migrate"}, migrateArgs...), &mout); err != nil {
		t.Fatalf("-migrate: %v\n%s", err, mout.String())
	}
	t.Log(strings.TrimSpace(mout.String()))
	prefix := fmt.Sprintf("%s-", uniqueName("serve"))
	n := namesWith(prefix, prefix+"twins")
	if err := createTopics(ctx, brokers, n); err != nil {
		t.Fatal(err)
	}

	pr, pw := io.Pipe()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(sctx, []string{"-serve", "127.0.0.1:0", "-brokers", strings.Join(brokers, ","), "-postgres", pgURL,
			"-group", n.twins, "-prefix", prefix, "-instance-id", "twin-test-1", "-session-timeout", "6s"}, pw)
		pw.Close()
	}()
	defer func() { stop(); <-done }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err != nil {
		t.Fatalf("no first line from -serve: %v (%v)", err, <-done)
	}
	t.Log(strings.TrimSpace(line))
	m := regexp.MustCompile(`http://([^/]+)/metrics`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("-serve printed %q, want its address", line)
	}
	base := "http://" + m[1]
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if err := waitFor(ctx, func() bool { c, _ := get("/readyz"); return c == http.StatusOK }); err != nil {
		c, body := get("/readyz")
		t.Fatalf("/readyz never answered 200: last %d %q", c, body)
	}
	if c, body := get("/readyz"); !strings.HasPrefix(body, "ready: joined, 4 of 4") {
		t.Errorf("/readyz: %d %q, want the member ready with the topic's 4 partitions", c, body)
	}
	if c, body := get("/healthz"); c != http.StatusOK {
		t.Errorf("/healthz: %d %q", c, body)
	}

	if err := produceUpdates(ctx, brokers, n.updates, 1, perDevice); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, twinsAt(db, perDevice)); err != nil {
		t.Fatalf("the member did not fold every update: %v", err)
	}
	var wrong, appended, pending int
	if err := errors.Join(
		db.QueryRow(ctx, `SELECT count(*) FROM twins WHERE version != $1 OR last_seq != version`, perDevice).Scan(&wrong),
		db.QueryRow(ctx, `SELECT count(*) FROM baton_outbox`).Scan(&appended)); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 || appended != desiredTotal {
		t.Errorf("%d twins at a wrong version, %d commands appended (want 0, %d)", wrong, appended, desiredTotal)
	}
	// The relay publishes every command it appended.
	if err := waitFor(ctx, func() bool {
		return db.QueryRow(ctx, `SELECT coalesce(sum(last_seq - delivered_seq), 0) FROM baton_outbox_cursors`).Scan(&pending) == nil && pending == 0
	}); err != nil {
		t.Errorf("%d commands never relayed", pending)
	}

	var metrics string
	want := memberMetrics(t)
	if err := waitFor(ctx, func() bool {
		_, metrics = get("/metrics")
		for _, name := range want {
			if !regexp.MustCompile(`(?m)^` + name + `(_bucket)?\{`).MatchString(metrics) {
				return false
			}
		}
		return true
	}); err != nil {
		for _, name := range want {
			if !regexp.MustCompile(`(?m)^` + name + `(_bucket)?\{`).MatchString(metrics) {
				t.Errorf("/metrics lacks %s", name)
			}
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("-serve returned %v after its context ended, want nil", err)
	}
	done <- nil
}

// The probes: /readyz answers 503 with the one-line reason until the member is ready, /healthz
// 503 once Run failed.
func TestProbes(t *testing.T) {
	rd := consumer.Readiness{}
	p := &probes{ready: func() consumer.Readiness { return rd }}
	srv := httptest.NewServer(p.mux(http.NotFoundHandler()))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	for _, c := range []struct {
		rd   consumer.Readiness
		code int
		body string
	}{
		{consumer.Readiness{}, 503, "not running"},
		{consumer.Readiness{Running: true, Cause: errors.New("dial tcp:\nrefused")}, 503, "not joined: dial tcp: refused"},
		{consumer.Readiness{Running: true, Joined: true, Assigned: 4, Claimed: 2}, 503, "claimed 2 of 4 assigned partitions"},
		{consumer.Readiness{Running: true, Joined: true}, 200, "ready: joined, 0 of 0 assigned partitions claimed"},
		{consumer.Readiness{Running: true, Joined: true, Assigned: 4, Claimed: 4}, 200, "ready: joined, 4 of 4 assigned partitions claimed"},
	} {
		rd = c.rd
		if code, body := get("/readyz"); code != c.code || body != c.body {
			t.Errorf("/readyz with %+v: %d %q, want %d %q", c.rd, code, body, c.code, c.body)
		}
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz before a failure: %d", code)
	}
	p.failed(errors.New("consumer: factory failed"))
	if code, body := get("/healthz"); code != 503 || body != "run failed: consumer: factory failed" {
		t.Errorf("/healthz after Run failed: %d %q", code, body)
	}
}

// TestUsageFile keeps usage.txt equal to `twin -h`: internal/deploytest checks the flags and
// variables of deploy/compose and deploy/k8s against it, so they cannot drift from the program.
// Regenerate: go run ./examples/twin -h > examples/twin/usage.txt 2>&1
func TestUsageFile(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	want, err := os.ReadFile("usage.txt")
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("usage.txt is stale; regenerate it: go run ./examples/twin -h > examples/twin/usage.txt 2>&1\ngot:\n%s", out.String())
	}
}

// Bad command lines fail with a usage error naming every problem at once, before connecting
// anywhere; the demo ignores the members' environment.
func TestFlags(t *testing.T) {
	t.Setenv("BATON_POSTGRES_URL", "")
	t.Setenv("BATON_KAFKA_BROKERS", "")
	t.Setenv("BATON_BROKERS", "")
	t.Setenv("BATON_REDIS_ADDR", "")
	for args, want := range map[string][]string{
		"-serve :0 -postgres x -brokers b -log-format xml": {"log format \"xml\""},
		"-serve :0 -postgres x -brokers b -log-level loud": {"log level \"loud\""},
		"-serve :0":            {"no PostgreSQL URL", "no Kafka brokers"},
		"-migrate":             {"no PostgreSQL URL"},
		"-serve :0 -migrate":   {"give one"},
		"-group g":             {"-group", "apply to -serve or -migrate only"},
		"-session-timeout x":   {"invalid value"},
		"extra":                {"unexpected arguments"},
		"-session-timeout -1s": {"negative"},
		"-serve :0 -postgres x -brokers b -session-timeout 6s": nil,
		"-postgres x -redis r":                                 {"two stores"},
		"-serve :0 -postgres x -redis r -brokers b":            {"two stores"},
		"-migrate -postgres x -redis r":                        {"a member on -redis needs none"},
		"-redis-allow-loss":                                    {"applies to -redis only"},
		"-redis r -redis-allow-loss":                           nil,
		"-serve :0 -redis r -brokers b":                        nil,
	} {
		_, err := parseFlags(strings.Fields(args), io.Discard)
		if want == nil {
			if err != nil {
				t.Errorf("%s: %v", args, err)
			}
			continue
		}
		if !errors.Is(err, errUsage) {
			t.Errorf("%s: %v, want a usage error", args, err)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", args, err, w)
			}
		}
	}
	t.Setenv("BATON_POSTGRES_URL", "postgres://from-env")
	t.Setenv("BATON_SESSION_TIMEOUT", "45s")
	t.Setenv("BATON_INSTANCE_ID", "twin-2")
	t.Setenv("BATON_KAFKA_BROKERS", "k-env:9092")
	t.Setenv("BATON_LOG_FORMAT", "json")
	if o, err := parseFlags(nil, io.Discard); err != nil || o.pgURL != "" || o.session != 0 || o.brokers != "" {
		t.Errorf("the demo read the environment: %+v %v", o, err)
	}
	if o, err := parseFlags([]string{"-serve", ":8080"}, io.Discard); err != nil || o.brokers != "k-env:9092" || o.logFormat != "json" {
		t.Errorf("-serve: %+v %v, want the brokers of $BATON_KAFKA_BROKERS and the log format of $BATON_LOG_FORMAT", o, err)
	}
	// A variable an earlier release read is refused, naming its replacement, rather than ignored.
	t.Setenv("BATON_BROKERS", "k-old:9092")
	if _, err := parseFlags([]string{"-serve", ":8080"}, io.Discard); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "$BATON_BROKERS is no longer read: use $BATON_KAFKA_BROKERS") {
		t.Errorf("-serve with $BATON_BROKERS set: %v, want a usage error naming $BATON_KAFKA_BROKERS", err)
	}
	if _, err := parseFlags(nil, io.Discard); err != nil {
		t.Errorf("the demo read $BATON_BROKERS: %v", err)
	}
	t.Setenv("BATON_BROKERS", "")
	o, err := parseFlags([]string{"-serve", ":8080", "-brokers", "k:9092", "-instance-id", "flag-wins"}, io.Discard)
	if err != nil || o.pgURL != "postgres://from-env" || o.session != 45*time.Second || o.instanceID != "flag-wins" || o.group != "twins" {
		t.Errorf("-serve: %+v %v, want the URL and session from the environment, the flag's instance id, group twins", o, err)
	}
	// Both stores' variables set: the command line's store wins, and without one the member
	// refuses to guess; -migrate is PostgreSQL's and reads only its variable.
	t.Setenv("BATON_REDIS_ADDR", "redis-from-env:6379")
	if o, err := parseFlags([]string{"-serve", ":8080", "-brokers", "k:9092", "-redis", "r:6379"}, io.Discard); err != nil || o.redis != "r:6379" || o.pgURL != "" {
		t.Errorf("-serve -redis with both variables set: %+v %v, want Redis only", o, err)
	}
	if o, err := parseFlags([]string{"-serve", ":8080", "-brokers", "k:9092", "-postgres", "postgres://flag"}, io.Discard); err != nil || o.redis != "" || o.pgURL != "postgres://flag" {
		t.Errorf("-serve -postgres with both variables set: %+v %v, want PostgreSQL only", o, err)
	}
	if _, err := parseFlags([]string{"-serve", ":8080", "-brokers", "k:9092"}, io.Discard); err == nil || !strings.Contains(err.Error(), "give one") {
		t.Errorf("-serve with both variables set and no store flag: %v, want a refusal", err)
	}
	if o, err := parseFlags([]string{"-migrate"}, io.Discard); err != nil || o.redis != "" || o.pgURL != "postgres://from-env" {
		t.Errorf("-migrate with both variables set: %+v %v, want PostgreSQL's", o, err)
	}
}

// The member exports spans only when the OTEL_* variables ask for OTLP (gRPC or HTTP), and refuses
// what it cannot do in one sentence.
func TestTracesFromEnv(t *testing.T) {
	for _, c := range []struct {
		exporter, endpoint, protocol string
		export                       bool
		err                          string
	}{
		{"", "", "", false, ""},
		{"none", "http://collector:4317", "", false, ""},
		{"otlp", "http://collector:4317", "grpc", true, ""},
		{"", "http://collector:4317", "", true, ""},
		{"zipkin", "", "", false, "only otlp and none"},
		{"otlp", "http://collector:4318", "http/protobuf", true, ""},
		{"otlp", "http://collector:4318", "http/json", false, "only grpc and http/protobuf"},
	} {
		t.Setenv("OTEL_TRACES_EXPORTER", c.exporter)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.endpoint)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", c.protocol)
		tp, shutdown, err := tracesFromEnv(context.Background(), "twin")
		if c.err != "" {
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: %v, want a usage error saying %q", c, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if _, sdk := tp.(*sdktrace.TracerProvider); sdk != c.export {
			t.Errorf("%+v: exporting %v, want %v", c, sdk, c.export)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = shutdown(ctx) // nothing was recorded: nothing to send
		cancel()
	}
}
