package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestMergeFoldMatchesOneByOne: merging a key's rows in Go gives the row the per-record
// statements would leave, and records out of order or missing show in bad.
func TestMergeFoldMatchesOneByOne(t *testing.T) {
	fold := func(vs ...int64) []any {
		row := FoldRow("k", vs[0])
		for _, v := range vs[1:] {
			MergeFold(row, FoldRow("k", v))
		}
		return row
	}
	for _, tc := range []struct {
		vs  []int64
		bad int64
	}{{[]int64{1, 2, 3}, 0}, {[]int64{1, 3}, 1}, {[]int64{1, 2, 2}, 1}, {[]int64{2, 1}, 1}} {
		row := fold(tc.vs...)
		var sum int64
		for _, v := range tc.vs {
			sum += v
		}
		if row[1] != int64(len(tc.vs)) || row[2] != sum || row[3] != tc.vs[0] || row[4] != tc.vs[len(tc.vs)-1] || row[5] != tc.bad {
			t.Errorf("fold %v = %v, want n=%d total=%d bad=%d", tc.vs, row, len(tc.vs), sum, tc.bad)
		}
	}
	// Merging two merged segments: [1 2] then [3 4] is in order; [1 2] then [4 5] is not.
	a, b := fold(1, 2), fold(3, 4)
	MergeFold(a, b)
	if a[5] != int64(0) || a[1] != int64(4) {
		t.Errorf("in-order segments merged to %v", a)
	}
	a, b = fold(1, 2), fold(4, 5)
	MergeFold(a, b)
	if a[5] != int64(1) {
		t.Errorf("a gap between segments: bad = %v, want 1", a[5])
	}
}

func TestRecordsOrder(t *testing.T) {
	recs := Records(3, 2)
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Key)+"="+string(r.Value))
	}
	if want := "k00000=1 k00001=1 k00002=1 k00000=2 k00001=2 k00002=2"; strings.Join(got, " ") != want {
		t.Errorf("records %s, want %s", strings.Join(got, " "), want)
	}
}

// TestCheckRefusesWrongFolds writes the fold correctly with the per-record statement, then
// breaks it four ways; Check must pass the first and refuse each of the others.
func TestCheckRefusesWrongFolds(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	const keys, perKey = 5, 4
	apply := func(key string, vs ...int64) {
		t.Helper()
		for _, v := range vs {
			if _, err := pool.Exec(ctx, FoldUpsert, key, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	fill := func() {
		t.Helper()
		if err := Reset(ctx, pool); err != nil {
			t.Fatal(err)
		}
		for _, r := range Records(keys, perKey) {
			apply(string(r.Key), mustValue(r.Value))
		}
	}
	fill()
	if err := Check(ctx, pool, keys, perKey); err != nil {
		t.Fatalf("a correct fold: %v", err)
	}
	for name, breakIt := range map[string]func(){
		"doubled": func() { apply("k00001", perKey) },
		"lost": func() {
			mustExec(t, pool, `UPDATE fold SET n = n - 1, total = total - last, last = last - 1 WHERE key = 'k00002'`)
		},
		"reordered": func() { mustExec(t, pool, `UPDATE fold SET bad = 1 WHERE key = 'k00003'`) },
		"missing":   func() { mustExec(t, pool, `DELETE FROM fold WHERE key = 'k00004'`) },
	} {
		fill()
		breakIt()
		if err := Check(ctx, pool, keys, perKey); err == nil {
			t.Errorf("%s: Check passed a wrong fold", name)
		}
	}
	// The set-based statement leaves the same fold as the per-record one.
	if err := Reset(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var recs [][2]any
	for _, r := range Records(keys, perKey) {
		recs = append(recs, [2]any{string(r.Key), mustValue(r.Value)})
	}
	for i := 0; i < len(recs); i += 7 {
		if _, err := pool.Exec(ctx, FoldUnnest, mergedArrays(recs[i:min(i+7, len(recs))])...); err != nil {
			t.Fatal(err)
		}
	}
	if err := Check(ctx, pool, keys, perKey); err != nil {
		t.Errorf("the unnest fold: %v", err)
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// TestServe runs a fake design through the worker's main: done once every record was
// committed, the report printed; a design that stops early or runs past the timeout fails.
func TestServe(t *testing.T) {
	job := func(design string, timeout time.Duration) []string {
		b, _ := json.Marshal(Job{Design: design, Records: 10, Keys: 2, Timeout: timeout})
		return []string{"-job", string(b)}
	}
	designs := map[string]Design{
		"ok": func(ctx context.Context, _ Job, rec *Recorder) error {
			for range 5 {
				rec.Committed(2, time.Millisecond)
			}
			<-ctx.Done()
			return nil
		},
		"early": func(context.Context, Job, *Recorder) error { return errors.New("boom") },
		"slow": func(ctx context.Context, _ Job, rec *Recorder) error {
			rec.Committed(1, time.Millisecond)
			<-ctx.Done()
			return nil
		},
	}
	var out bytes.Buffer
	if err := Serve(context.Background(), job("ok", time.Minute), designs, &out); err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report %q: %v", out.String(), err)
	}
	if rep.Records != 10 || rep.Batches != 5 || rep.P50 != time.Millisecond || rep.Wall <= 0 {
		t.Errorf("report %+v", rep)
	}
	if err := Serve(context.Background(), job("early", time.Minute), designs, &out); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("a design that failed: %v", err)
	}
	if err := Serve(context.Background(), job("slow", 50*time.Millisecond), designs, &out); err == nil || !strings.Contains(err.Error(), "1 of 10 records") {
		t.Errorf("a design past its timeout: %v", err)
	}
	if err := Serve(context.Background(), job("nope", time.Minute), designs, &out); err == nil {
		t.Error("an unknown design was served")
	}
}

// TestSummarize: ratios are taken within a round, the ceiling is the best connection count
// of the round, and a failed run does not count.
func TestSummarize(t *testing.T) {
	rep := func(d string, recs int64, wall time.Duration) Report {
		return Report{Design: d, Records: recs, Wall: wall}
	}
	results := []Result{
		{Design: "baton-fast", Round: 0, Report: rep("baton-fast", 100, time.Second)},
		{Design: "naive", Round: 0, Report: rep("naive", 10, time.Second)},
		{Design: "ceiling/1", Round: 0, Report: rep("ceiling", 100, 500*time.Millisecond)},
		{Design: "ceiling/2", Round: 0, Report: rep("ceiling", 100, 250*time.Millisecond)},
		{Design: "kafka-read", Round: 0, Report: rep("kafka-read", 100, 500*time.Millisecond)},
		{Design: "sqlite-fast", Round: 0, Report: rep("sqlite-fast", 50, time.Second)},
		{Design: "sqlite-ceiling", Round: 0, Report: rep("sqlite-ceiling", 100, 500*time.Millisecond)},
		{Design: "redis-fast", Round: 0, Report: rep("redis-fast", 90, time.Second)},
		{Design: "redis-unfenced", Round: 0, Report: rep("redis-unfenced", 100, time.Second)},
		// Round 2 ran on a slower machine: the ratios stay.
		{Design: "baton-fast", Round: 1, Report: rep("baton-fast", 100, 2*time.Second)},
		{Design: "naive", Round: 1, Report: rep("naive", 10, 2*time.Second)},
		{Design: "ceiling/1", Round: 1, Report: rep("ceiling", 100, time.Second)},
		{Design: "ceiling/2", Round: 1, Err: errors.New("check: wrong\nmore")},
		{Design: "redislock", Round: 1, Err: errors.New("check: wrong")},
		{Design: "redis-fast", Round: 1, Report: rep("redis-fast", 80, 2*time.Second)},
		{Design: "redis-unfenced", Round: 1, Report: rep("redis-unfenced", 40, time.Second)},
	}
	rows := Summarize(results)
	byName := map[string]Row{}
	var names []string
	for _, r := range rows {
		byName[r.Design] = r
		names = append(names, r.Design)
	}
	if got := strings.Join(names, " "); got != "baton-fast redislock naive ceiling/1 ceiling/2 kafka-read sqlite-fast sqlite-ceiling redis-fast redis-unfenced" {
		t.Errorf("order %s", got)
	}
	if r := byName["naive"]; r.VsBaton != 0.1 || r.OK != 2 {
		t.Errorf("naive %+v: want 0.1 of baton-fast in both rounds", r)
	}
	// Round 1: best ceiling 400/s -> 0.25; round 2: best (only) ceiling/1 100/s -> 0.5.
	if r := byName["baton-fast"]; r.VsCeiling != 0.375 || r.Rate != 75 {
		t.Errorf("baton-fast %+v: want vs ceiling 0.375 (median of 0.25, 0.5), rate 75", r)
	}
	// Round 1 only (no kafka-read in round 2): bound 1/(1/200 + 1/400) = 133.3/s -> 0.75.
	if r := byName["baton-fast"]; r.VsBound != 0.75 {
		t.Errorf("baton-fast vs bound %v, want 0.75", r.VsBound)
	}
	// SQLite's designs against SQLite's ceiling (200/s), not PostgreSQL's best (400/s); bound
	// 1/(1/200 + 1/200) = 100/s -> 0.5.
	if r := byName["sqlite-fast"]; r.VsCeiling != 0.25 || r.VsBound != 0.5 {
		t.Errorf("sqlite-fast %+v: want vs ceiling 0.25, vs bound 0.5", r)
	}
	if r := byName["kafka-read"]; r.VsBound != 0 || byName["ceiling/1"].VsBound != 0 {
		t.Errorf("a design not fed by Kafka has a bound: %+v", r)
	}
	// Redis's designs: no ceiling, and fenced/unfenced within each round (0.9 and 1.0).
	if r := byName["redis-fast"]; r.VsCeiling != 0 || r.VsBound != 0 || r.VsUnfenced != 0.95 {
		t.Errorf("redis-fast %+v: want no ratio to a ceiling, 0.95 of redis-unfenced", r)
	}
	if r := byName["ceiling/2"]; r.OK != 1 || r.Runs != 2 || r.FirstError != "check: wrong" {
		t.Errorf("ceiling/2 %+v", r)
	}
	if r := byName["redislock"]; r.OK != 0 {
		t.Errorf("redislock %+v counted", r)
	}
	var targets bytes.Buffer
	WriteTargets(&targets, rows)
	for _, want := range []string{
		"baton-fast vs the PostgreSQL ceiling: **0.38, missed** (target >= 0.70); 0.75 of the bound",
		"baton-fast vs naive (one row per transaction): **10.00, met** (target >= 10.00)",
		"baton-fast vs redislock (a Redis lock per key): not measured",
		"sqlite-fast vs the SQLite ceiling: **0.25, missed**",
		"baton-fast / baton-unfenced (fenced vs unfenced, PostgreSQL): not measured",
		"redis-fast / redis-unfenced (fenced vs unfenced, Redis; same-round ratio): **0.95, met** (target >= 0.90)",
	} {
		if !strings.Contains(targets.String(), want) {
			t.Errorf("targets do not say %q:\n%s", want, targets.String())
		}
	}
	var table, svg bytes.Buffer
	WriteTable(&table, rows, Conditions{Redis: "appendonly no"})
	WriteChart(&svg, rows, Conditions{})
	if !strings.Contains(table.String(), "| redislock | - | did not count: check: wrong |") || !strings.Contains(table.String(), "Redis (redis- designs): appendonly no") {
		t.Errorf("table:\n%s", table.String())
	}
	if !strings.HasPrefix(svg.String(), "<svg") || !strings.Contains(svg.String(), "did not count") {
		t.Errorf("chart:\n%s", svg.String())
	}
}

// TestCheckFold: the fold read from Redis passes when exact and fails on a key missing,
// doubled, or out of order.
func TestCheckFold(t *testing.T) {
	good := func() map[string][]int64 {
		return map[string][]int64{"k00000": {3, 6, 1, 3, 0}, "k00001": {3, 6, 1, 3, 0}}
	}
	if err := CheckFold(2, 3, good()); err != nil {
		t.Fatalf("an exact fold: %v", err)
	}
	for name, breakIt := range map[string]func(map[string][]int64){
		"missing":   func(f map[string][]int64) { delete(f, "k00001") },
		"doubled":   func(f map[string][]int64) { f["k00001"] = []int64{4, 9, 1, 3, 1} },
		"reordered": func(f map[string][]int64) { f["k00000"][4] = 1 },
		"extra":     func(f map[string][]int64) { f["k00002"] = []int64{3, 6, 1, 3, 0} },
	} {
		f := good()
		breakIt(f)
		if err := CheckFold(2, 3, f); err == nil {
			t.Errorf("%s: CheckFold passed a wrong fold", name)
		}
	}
}

func TestConfigReportsEveryProblem(t *testing.T) {
	cfg := Config{Records: 5, Keys: 10, Partitions: 0, Rounds: 0, Conns: []int{0}, Designs: []string{"nope", "redislock", "watermill"}}
	err := cfg.Validate()
	if !errors.Is(err, ErrUsage) {
		t.Errorf("not ErrUsage: %v", err)
	}
	for _, want := range []string{"-records 5", "-partitions 0", "-rounds 0", "-conns", `unknown design "nope"`, "need Redis", "needs Kafka"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
}
