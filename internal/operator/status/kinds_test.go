package status_test

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/status"
)

// TestRecoveryKinds: a static member's same-generation handover, a regression and an
// operator's recovery, recorded as the consumer and baton recover record them, are told apart
// by status (summary, JSON kind, text), by eras' kind column and by the page, which labels the
// handover a handover and lists the tokens each event fenced under "Refused writes".
func TestRecoveryKinds(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "f.db")
	st, err := sqlitefence.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	must := func(_ fence.Token, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Claim(ctx, k, fence.Token{Epoch: 7}, "twin-0/a"); err != nil {
		t.Fatal(err)
	}
	// The consumer's handover: its own member's previous claimant held the same generation.
	must(st.Recover(ctx, k, fence.Token{Epoch: 7}, 7, "twin-0/b",
		"consumer group g: handover at generation 7: claimant twin-0/a replaced by twin-0/b (verified as the owner with the coordinator)"))
	if _, err := st.Claim(ctx, k, fence.Token{Era: 1, Epoch: 9}, "twin-1/c"); err != nil {
		t.Fatal(err)
	}
	// The consumer's regression: the stored generation was ahead of the verified owner's.
	must(st.Recover(ctx, k, fence.Token{Era: 1, Epoch: 9}, 7, "twin-0/d",
		"consumer group g: member verified as the owner at generation 7 with the coordinator; sink held 1.9 against its 1.7"))
	must(st.Recover(ctx, k, fence.Token{Era: 2, Epoch: 7}, 0, "operator:x@y", "group recreated (by operator:x@y)"))

	c, err := status.NewCollector(status.Config{Brokers: []string{"127.0.0.1:1"}, Store: path, Group: "g", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap, _ := c.Collect(ctx)
	if sm := snap.Summary; sm.Recoveries != 3 || sm.Handovers != 1 || sm.Regressions != 1 {
		t.Errorf("summary %+v: want 3 recoveries, 1 handover, 1 regression", sm)
	}
	var kinds []string
	for _, r := range snap.Recoveries {
		kinds = append(kinds, r.Kind)
	}
	if strings.Join(kinds, ",") != "handover,regression,operator" {
		t.Errorf("kinds %v, want handover, regression, operator", kinds)
	}
	var text bytes.Buffer
	if err := status.WriteText(&text, snap); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "3 recoveries (1 handovers, 1 after a verified regression)") || !strings.Contains(text.String(), "2.7->3.0 operator ") {
		t.Errorf("text summary:\n%s", text.String())
	}
	text.Reset()
	if err := status.WriteRecoveries(&text, snap.Recoveries); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(text.String()), "\n"); len(lines) != 4 || !strings.Contains(lines[1], " handover ") || !strings.Contains(lines[2], " regression ") || !strings.Contains(lines[3], " operator ") {
		t.Errorf("recoveries:\n%s", text.String())
	}

	page, err := status.NewPage(c)
	if err != nil {
		t.Fatal(err)
	}
	page.Poll(ctx)
	rec := httptest.NewRecorder()
	page.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	body, _ := io.ReadAll(rec.Body)
	html := string(body)
	for _, want := range []string{
		"<b>handover</b> t/0: era advanced 0.7 -&gt; 1.7",
		"<b>regression</b> t/0: era advanced 1.9 -&gt; 2.7",
		"<b>recovery</b> t/0: era advanced 2.7 -&gt; 3.0",
		"1 handovers, 1 after a verified regression",
		"2.7→3.0 operator ",
		`<h2>Refused writes</h2>`,
		"t/0: token <b>0.7</b> and older refused (handover)",
		"t/0: token <b>1.9</b> and older refused (regression)",
		"baton_consumer_stale_refusals_total",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(html, "<b>regression</b> t/0: era advanced 0.7") {
		t.Error("the page labels the handover a regression")
	}
}
