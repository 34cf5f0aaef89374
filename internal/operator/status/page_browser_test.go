package status_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/operator/telemetry"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// chromiumPath finds Debian's chromium ($BATON_CHROMIUM first); without one the test skips,
// or fails in CI (deploy/local/chromium.sh install provides it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BATON_CHROMIUM"); p != "" {
		return p
	}
	for _, n := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	const hint = "no chromium on PATH and BATON_CHROMIUM is not set: run deploy/local/chromium.sh install"
	if os.Getenv("CI") != "" {
		t.Fatal(hint)
	}
	t.Skip(hint)
	return ""
}

// artifactDir is where the test writes its screenshot: $BATON_TEST_ARTIFACTS, or a directory
// under the system's temporary directory.
func artifactDir(t *testing.T) string {
	dir := os.Getenv("BATON_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "baton-test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPageInBrowser serves the live page of a real group (real broker, real PostgreSQL) and
// loads it in headless Chromium: no console errors, the owner of a partition a running member
// owns is shown, the page updates itself after a takeover, and a screenshot is written. It also
// scrapes the page's /metrics and finds every metric telemetry's documentation lists.
func TestPageInBrowser(t *testing.T) {
	chrome := chromiumPath(t)
	const parts = 4
	e := newRealEnv(t, parts)
	ctx := testenv.Context(t, 3*time.Minute)
	m, err := telemetry.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Shutdown(context.Background()) }()

	e.produce(t, 40)
	stopA := e.member(t, "member-a", m.Provider())
	c := e.collector(t)
	waitSnap(t, c, 60*time.Second, "every partition owned by member-a", allOwnedBy("member-a", parts, true))
	page, err := status.NewPage(c, status.Interval(500*time.Millisecond), status.Window(2*time.Minute),
		status.Metrics(m.Handler()), status.MeterProvider(m.Provider()))
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopPage := context.WithCancel(ctx)
	addrc := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := page.ListenAndServe(pctx, "127.0.0.1:0", func(a string) { addrc <- a }); err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	}()
	defer func() { stopPage(); wg.Wait() }()
	e.produceLoop(t, 50*time.Millisecond)
	base := "http://" + <-addrc

	actx, cancelA := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.WindowSize(1500, 1000),
		chromedp.Env("TMPDIR="+t.TempDir()))...) // Chromium's own temporary files go with the test
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	var mu sync.Mutex
	var consoleErrs []string
	chromedp.ListenTarget(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError || ev.Type == runtime.APITypeWarning {
				consoleErrs = append(consoleErrs, "console."+string(ev.Type))
			}
		case *runtime.EventExceptionThrown:
			consoleErrs = append(consoleErrs, "exception: "+ev.ExceptionDetails.Text)
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.LevelError || ev.Entry.Level == log.LevelWarning {
				consoleErrs = append(consoleErrs, string(ev.Entry.Level)+": "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		}
	})
	owner := func(p int) string {
		var s string
		rctx, cancel := context.WithTimeout(bctx, 5*time.Second)
		defer cancel()
		if err := chromedp.Run(rctx, chromedp.Text(`tr[data-partition="`+string(rune('0'+p))+`"] td.owner`, &s, chromedp.ByQuery)); err != nil {
			return "(" + err.Error() + ")"
		}
		return s
	}
	var navJSON string
	if err := chromedp.Run(bctx, log.Enable(), runtime.Enable(), chromedp.Navigate(base+"/"), chromedp.WaitVisible("#partitions", chromedp.ByID),
		chromedp.Evaluate(`(() => { const n = performance.getEntriesByType('navigation')[0]; return 'response ' + (n.responseEnd - n.requestStart).toFixed(1) + 'ms, loaded ' + (n.loadEventEnd > 0 ? (n.loadEventEnd - n.startTime).toFixed(1) : (n.domContentLoadedEventEnd - n.startTime).toFixed(1)) + 'ms'; })()`, &navJSON)); err != nil {
		t.Fatalf("loading %s: %v", base, err)
	}
	t.Logf("page in Chromium: %s; server-side renders %v", navJSON, page.RenderTimes())
	if got := owner(0); !strings.HasPrefix(got, "member-a@") {
		t.Errorf("partition 0's owner on the page = %q, want member-a@host", got)
	}

	// /metrics: every metric the telemetry docs list, with its labels.
	checkMetricsDocumented(t, base+"/metrics")

	// Takeover: after a few seconds of member-a's writes (ticks on the timeline), member-a
	// leaves and member-b joins; the page refreshes itself and shows member-b.
	time.Sleep(3 * time.Second)
	stopA()
	e.member(t, "member-b", nil)
	deadline := time.Now().Add(60 * time.Second)
	got := owner(0)
	for !strings.HasPrefix(got, "member-b@") && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		got = owner(0)
	}
	if !strings.HasPrefix(got, "member-b@") {
		t.Fatalf("after the takeover the page still shows partition 0 owned by %q, want member-b", got)
	}
	// The takeover is listed once the new owner's claim raised the token, and drawn in the timeline.
	var events, svg string
	deadline = time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(events, "takeover") {
		time.Sleep(500 * time.Millisecond)
		rctx, cancel := context.WithTimeout(bctx, 5*time.Second)
		_ = chromedp.Run(rctx, chromedp.Text("#events", &events, chromedp.ByID), chromedp.OuterHTML("#timeline svg", &svg, chromedp.ByQuery))
		cancel()
	}
	if !strings.Contains(events, "takeover") || !strings.Contains(events, "member-b") {
		t.Errorf("events on the page = %q, want a takeover by member-b", events)
	}
	if !strings.Contains(svg, "<svg") || !strings.Contains(svg, "batches; last by member-") {
		t.Errorf("timeline on the page has no batches drawn:\n%.500s", svg)
	}
	var png []byte
	if err := chromedp.Run(bctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifactDir(t), "status-page.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	mu.Lock()
	defer mu.Unlock()
	if len(consoleErrs) > 0 {
		t.Errorf("console errors and warnings: %q", consoleErrs)
	}
}

// docMetric is a line of the table in telemetry's doc.go.
var docMetric = regexp.MustCompile(`^//\t(baton_[a-z_]+)\s+(.*)$`)

// checkMetricsDocumented scrapes url and checks every metric listed in internal/telemetry/doc.go is
// there with every label listed.
func checkMetricsDocumented(t *testing.T, url string) {
	t.Helper()
	f, err := os.Open("../telemetry/doc.go")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := docMetric.FindStringSubmatch(sc.Text()); m != nil {
			want[m[1]] = strings.Split(strings.ReplaceAll(m[2], " ", ""), ",")
		}
	}
	if len(want) < 10 {
		t.Fatalf("found %d metrics in internal/telemetry/doc.go's table; the test's parser is broken", len(want))
	}
	// The gauges are observed from the page's last read, the consumer's counters on its own
	// schedule; retry briefly until everything was exported once.
	var missing []string
	for range 20 {
		body, err := get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		missing = missing[:0]
		for name, labels := range want {
			line := ""
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+"_bucket{") {
					line = l
					break
				}
			}
			if line == "" {
				missing = append(missing, name)
				continue
			}
			for _, lab := range labels {
				if !strings.Contains(line, lab+"=") {
					missing = append(missing, name+" label "+lab)
				}
			}
		}
		if len(missing) == 0 {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Errorf("/metrics lacks what internal/telemetry/doc.go lists: %q", missing)
}

func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status)
	}
	var b strings.Builder
	_, err = bufio.NewReader(resp.Body).WriteTo(&b)
	return b.String(), err
}
