package audit_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/operator/audit"
)

// The HTTP handler lists the violations found, on its page and as JSON, and serves the metrics
// handler it is given.
func TestHandlerListsViolations(t *testing.T) {
	e := sqliteEnv(t)
	e.produce(t, 3)
	e.claim(t, tok5)
	e.apply(t, tok5, 0, 2)
	a, _ := e.auditor(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "baton_audit_violations_total 1\n") })
	srv := httptest.NewServer(a.Handler(metrics))
	defer srv.Close()
	clean(t, a, "one claim")
	e.exec(t, `UPDATE baton_fences SET epoch = 1`)
	within(t, e, a, audit.Tokens, "stored token went back")

	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return string(b)
	}
	var doc struct {
		Group  string
		Recent []audit.Violation
	}
	if err := json.Unmarshal([]byte(get("/violations.json")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Group != e.group || len(doc.Recent) != 1 || doc.Recent[0].Check != audit.Tokens || doc.Recent[0].Topic != e.src {
		t.Errorf("violations.json = %+v, want the token violation of %s", doc, e.src)
	}
	if page := get("/"); !strings.Contains(page, "stored token went back") || !strings.Contains(page, "previous=0.5") {
		t.Errorf("the page does not show the violation with its evidence:\n%s", page)
	}
	if m := get("/metrics"); !strings.Contains(m, "baton_audit_violations_total") {
		t.Errorf("/metrics = %q", m)
	}
}

// Run reports a corruption within two intervals of it, in real time, and returns nil when its
// context ends.
func TestRunReportsWithinTwoIntervals(t *testing.T) {
	const interval = 300 * time.Millisecond
	e := sqliteEnv(t)
	e.produce(t, 10)
	e.claim(t, tok5)
	e.apply(t, tok5, 0, 2)
	a, _ := e.auditor(t, func(c *audit.Config) { c.Now = time.Now })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, interval) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if last, _ := a.Last(); last != nil && last.Partitions == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no pass judged the partition within 10s")
		}
	}
	at := time.Now()
	commit(t, e, 9)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, recent := a.Last()
		if len(recent) == 0 {
			continue
		}
		v := recent[0]
		if v.Check != audit.Skipped || !strings.Contains(v.What, "committed offset ahead") {
			t.Fatalf("found %v, want the committed offset ahead", v)
		}
		// A pass itself takes time: allow one on top of the two intervals.
		if took := v.At.Sub(at); took > 2*interval+time.Second {
			t.Errorf("reported %s after the corruption, want within two intervals (%s)", took, 2*interval)
		}
		return
	}
	t.Fatal("no violation reported within 10s")
}
