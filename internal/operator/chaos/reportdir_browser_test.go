package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
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

// A long run's report opens in headless Chromium from its files alone: the summary is drawn
// within a screen, no script runs (not even one a fault's detail carries), the index links
// every lane file, and a fault's bar in a lane file leads to that fault's row of the fault
// list. A screenshot of the index is left in $BATON_TEST_ARTIFACTS (or the temporary
// directory's baton-test-artifacts).
func TestReportInBrowser(t *testing.T) {
	chrome := chromiumPath(t)
	r, d := syntheticRun(1000, 300, 2*time.Hour)
	r.Faults[4].Detail = `<script>document.title = "ran"</script><img src=x onerror="document.title='ran'">`
	dir := t.TempDir()
	if err := writeReport(dir, r, d); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	actx, cancelA := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.WindowSize(1450, 1000),
		chromedp.Env("TMPDIR="+t.TempDir()))...) // Chromium's own temporary files go with the test
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	var mu sync.Mutex
	var problems []string
	chromedp.ListenTarget(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+ev.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError {
				problems = append(problems, "console error")
			}
		}
	})

	var box []float64
	var links []string
	var title string
	var png []byte
	if err := chromedp.Run(bctx, runtime.Enable(), chromedp.Navigate("file://"+filepath.Join(dir, ReportIndex)),
		chromedp.WaitVisible("svg", chromedp.ByQuery),
		chromedp.Evaluate(`(() => { const r = document.querySelector('svg').getBoundingClientRect(); return [r.width, r.height]; })()`, &box),
		chromedp.Evaluate(`[...document.querySelectorAll('a')].map(a => a.getAttribute('href'))`, &links),
		chromedp.Title(&title),
		chromedp.FullScreenshot(&png, 90)); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifactDir(t), "chaos-report-index.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("summary drawn %v px; screenshot %s", box, shot)
	if len(box) != 2 || box[0] > 1400 || box[1] > 900 || box[1] < 300 {
		t.Errorf("summary drawn %v px, want at most 1400 × 900 and taller than 300", box)
	}
	if strings.Contains(title, "ran") {
		t.Error("a script in a fault's detail ran")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "lanes-*.svg"))
	for _, f := range files {
		if !slices.Contains(links, filepath.Base(f)) {
			t.Errorf("the index in the browser has no link to %s", filepath.Base(f))
		}
	}

	// A fault's bar in a lane file is a link to its row.
	var hash string
	var rows int
	if err := chromedp.Run(bctx, chromedp.Navigate("file://"+filepath.Join(dir, "lanes-02.svg")),
		chromedp.WaitReady(`a[href="faults.html#f5"]`, chromedp.ByQuery),
		chromedp.Click(`a[href="faults.html#f5"] rect`, chromedp.ByQuery),
		chromedp.WaitVisible("#f5", chromedp.ByID),
		chromedp.Evaluate(`location.hash`, &hash),
		chromedp.Evaluate(`document.querySelectorAll('tr[id]').length`, &rows),
		chromedp.Title(&title)); err != nil {
		t.Fatal(err)
	}
	if hash != "#f5" || rows != len(r.Faults) {
		t.Errorf("the bar led to %q of a list of %d faults, want #f5 of %d", hash, rows, len(r.Faults))
	}
	if strings.Contains(title, "ran") {
		t.Error("a script in a fault's detail ran in the fault list")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the browser reported: %v", problems)
	}
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
