package chaos

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// mixed is a mix of kinds of every hold.
var mixed = []FaultKind{FaultFreeze, FaultKill, FaultBrokerRestart, FaultDBRestart, FaultGroupDelete, FaultPausedBrokerRestart, FaultNetFlaky, FaultTerm, FaultNetDBCut}

// TestPlanScheduleDeterministic: the same seed draws the same schedule, another seed another;
// every kind comes first once, in order, and every fault holds what its kind holds.
func TestPlanScheduleDeterministic(t *testing.T) {
	a := planSchedule(7, mixed, 40, 3, 3, 3, 3*time.Second)
	b := planSchedule(7, mixed, 40, 3, 3, 3, 3*time.Second)
	c := planSchedule(8, mixed, 40, 3, 3, 3, 3*time.Second)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 7 drew two schedules:\n%v\n%v", a, b)
	}
	if reflect.DeepEqual(a, c) {
		t.Fatal("seeds 7 and 8 drew the same schedule")
	}
	if len(a) != 40 {
		t.Fatalf("%d faults planned, want 40", len(a))
	}
	for i, s := range a {
		if s.N != i+1 || s.Overlap != 3 || s.Worker < 1 || s.Worker > 3 || s.Node < 1 || s.Node > 3 {
			t.Errorf("fault %d: %+v", i+1, s)
		}
		if i < len(mixed) && s.Kind != mixed[i] {
			t.Errorf("fault %d is a %s, want %s (each kind once first, in order)", i+1, s.Kind, mixed[i])
		}
		if i > 0 && s.AtMS < a[i-1].AtMS {
			t.Errorf("fault %d starts at %d ms, before fault %d's %d ms", i+1, s.AtMS, i, a[i-1].AtMS)
		}
		want := map[Hold]string{HoldWorker: fmt.Sprintf("worker %d", s.Worker), HoldWorkerDatabase: fmt.Sprintf("worker %d", s.Worker), HoldWorkerDatabaseBrokers: fmt.Sprintf("worker %d", s.Worker), HoldBroker: fmt.Sprintf("broker %d", s.Node),
			HoldDatabase: "database", HoldEverything: "everything", HoldCoordinator: fmt.Sprintf("worker %d", s.Worker)}[holdOf(s.Kind)]
		if s.Holds[0] != want {
			t.Errorf("fault %d (%s) holds %v, want %s first", i+1, s.Kind, s.Holds, want)
		}
		if holdOf(s.Kind) == HoldCoordinator && !reflect.DeepEqual(s.Holds[1:], []string{"broker 1", "broker 2", "broker 3"}) {
			t.Errorf("fault %d (%s) holds %v, want every broker node too", i+1, s.Kind, s.Holds)
		}
		if holdOf(s.Kind) == HoldWorkerDatabaseBrokers && !reflect.DeepEqual(s.Holds[1:], []string{"database", "broker 1", "broker 2", "broker 3"}) {
			t.Errorf("fault %d (%s) holds %v, want the database and every broker node too", i+1, s.Kind, s.Holds)
		}
	}
}

func TestConflicts(t *testing.T) {
	f := func(holds ...string) ScheduledFault { return ScheduledFault{Holds: holds} }
	cases := []struct {
		in   []ScheduledFault
		s    ScheduledFault
		want bool
	}{
		{nil, f("everything"), false},
		{[]ScheduledFault{f("worker 1")}, f("everything"), true},
		{[]ScheduledFault{f("everything")}, f("database"), true},
		{[]ScheduledFault{f("worker 1")}, f("worker 1"), true},
		{[]ScheduledFault{f("worker 1")}, f("worker 2"), false},
		{[]ScheduledFault{f("worker 1"), f("worker 2")}, f("worker 3"), true}, // no worker left to take over
		{[]ScheduledFault{f("worker 1"), f("worker 2")}, f("database"), false},
		{[]ScheduledFault{f("worker 1", "broker 1")}, f("broker 1"), true},
		{[]ScheduledFault{f("broker 2")}, f("broker 1"), false},
		{[]ScheduledFault{f("database")}, f("database"), true},
		{[]ScheduledFault{f("database")}, f("worker 2", "database"), true},
		{[]ScheduledFault{f("worker 1")}, f("worker 2", "database"), false},
	}
	for _, c := range cases {
		if got := conflicts(c.in, c.s, 3); got != c.want {
			t.Errorf("conflicts(%v, %v) = %v, want %v", c.in, c.s.Holds, got, c.want)
		}
	}
}

// TestRunScheduleDisjoint runs a schedule of every hold with faults of random lengths: faults
// must run together (up to Overlap), never two at once that hold the same thing, never one
// that holds everything beside another, and always in the schedule's order.
func TestRunScheduleDisjoint(t *testing.T) {
	kinds := append(slices.Clone(mixed), FaultDBFailover, FaultStorm, FaultNetDBCut)
	sched := planSchedule(3, kinds, 60, 3, 3, 3, 20*time.Millisecond)
	var mu sync.Mutex
	held := map[string]int{}
	var order []int
	maxIn, in := 0, 0
	rng := rand.New(rand.NewSource(1))
	lengths := map[int]time.Duration{}
	for _, s := range sched {
		lengths[s.N] = time.Duration(5+rng.Intn(40)) * time.Millisecond
	}
	started := func(format string, args ...any) { // the runner's line as it starts a fault
		if strings.Contains(format, "starts") {
			order = append(order, args[0].(int))
		}
	}
	faults := runSchedule(context.Background(), sched, runOpts{overlap: 3, workers: 3, progress: started}, func(_ context.Context, s ScheduledFault) Fault {
		f := Fault{Kind: s.Kind, N: s.N, Start: time.Now()}
		mu.Lock()
		in++
		maxIn = max(maxIn, in)
		for _, x := range s.Holds {
			if held[x]++; held[x] > 1 {
				t.Errorf("fault %d (%s) holds %s, already held", s.N, s.Kind, x)
			}
		}
		if held["everything"] > 0 && in > 1 {
			t.Errorf("fault %d (%s) runs beside a fault that holds everything", s.N, s.Kind)
		}
		workers := 0
		for x, n := range held {
			if strings.HasPrefix(x, "worker ") && n > 0 {
				workers++
			}
		}
		if workers > 2 {
			t.Errorf("fault %d (%s): every worker held", s.N, s.Kind)
		}
		mu.Unlock()
		time.Sleep(lengths[s.N])
		mu.Lock()
		in--
		for _, x := range s.Holds {
			held[x]--
		}
		mu.Unlock()
		f.End = time.Now()
		return f
	})
	if len(faults) != len(sched) {
		t.Fatalf("%d faults ran, want %d", len(faults), len(sched))
	}
	for i, f := range faults {
		if f.N != i+1 {
			t.Fatalf("fault %d returned in place %d: want the schedule's order", f.N, i+1)
		}
	}
	if !slices.IsSorted(order) || len(order) != len(sched) {
		t.Errorf("faults started out of the schedule's order: %v", order)
	}
	if maxIn < 2 || maxIn > 3 {
		t.Errorf("at most %d faults in flight, want 2 or 3", maxIn)
	}
	concurrent, most := overlapStats(faults)
	if most != maxIn || concurrent == 0 {
		t.Errorf("overlapStats: %d concurrent, %d at most; the run had %d at most", concurrent, most, maxIn)
	}
}

// TestRunScheduleDeadline: no fault starts after the deadline, and the run waits for the ones
// in flight.
func TestRunScheduleDeadline(t *testing.T) {
	sched := planSchedule(1, []FaultKind{FaultFreeze, FaultKill}, 50, 2, 3, 1, 0)
	var n int
	var mu sync.Mutex
	faults := runSchedule(context.Background(), sched, runOpts{overlap: 2, workers: 3, deadline: 100 * time.Millisecond}, func(_ context.Context, s ScheduledFault) Fault {
		mu.Lock()
		n++
		mu.Unlock()
		f := Fault{Kind: s.Kind, N: s.N, Start: time.Now()}
		time.Sleep(30 * time.Millisecond)
		f.End = time.Now()
		return f
	})
	if len(faults) != n || n == 0 || n >= 20 {
		t.Errorf("%d faults started, %d returned: want some, all returned, none after the deadline", n, len(faults))
	}
}

func TestOverlapStats(t *testing.T) {
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	faults := []Fault{
		{Start: at(0), End: at(10)},
		{Start: at(5), End: at(12)},
		{Start: at(6), End: at(8)},
		{Start: at(12), End: at(14)}, // touches the second: no overlap
		{Start: at(20), End: at(21)},
	}
	if c, m := overlapStats(faults); c != 3 || m != 3 {
		t.Errorf("overlapStats = %d concurrent, %d at most; want 3, 3", c, m)
	}
}

// TestScheduleFileRoundTrip: a schedule read back from its file is the schedule, and a file
// that is not one is refused.
func TestScheduleFileRoundTrip(t *testing.T) {
	sched := planSchedule(5, slices.Concat(EveryFault, FailoverFaults, NetFaults), 30, 4, 3, 3, time.Second)
	var b bytes.Buffer
	if err := WriteSchedule(&b, sched); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n"); n != len(sched) {
		t.Fatalf("%d lines for %d faults", n, len(sched))
	}
	got, err := ReadSchedule(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sched) {
		t.Fatalf("read back:\n%v\nwant:\n%v", got, sched)
	}
	for _, bad := range []string{
		"",
		`{"n":1,"kind":"melt","at_ms":0,"worker":1,"node":1,"holds":["worker 1"],"seed":1,"overlap":2}`,
		`{"n":2,"kind":"freeze","at_ms":0,"worker":1,"node":1,"holds":["worker 1"],"seed":1,"overlap":2}`,
		`{"n":1,"kind":"freeze","at_ms":0,"worker":0,"node":1,"holds":["worker 1"],"seed":1,"overlap":2}`,
		`{"n":1,"kind":"freeze","at_ms":0,"worker":1,"node":1,"holds":["worker 1"],"seed":1,"overlap":2,"extra":1}`,
		`{"n":1,"kind":"all","at_ms":0,"worker":1,"node":1,"holds":["worker 1"],"seed":1,"overlap":2}`,
	} {
		if _, err := ReadSchedule(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadSchedule(%q) accepted it", bad)
		}
	}
}

// TestKindsTable: every kind ParseFaults knows is in the table, once.
func TestKindsTable(t *testing.T) {
	seen := map[FaultKind]int{}
	for _, k := range Kinds() {
		seen[k.Kind]++
	}
	for _, k := range slices.Concat(EveryFault, FailoverFaults, NetFaults, []FaultKind{FaultRedisRestart}) {
		if seen[k] != 1 {
			t.Errorf("kind %s is in the table %d times, want once", k, seen[k])
		}
	}
}

// TestSlotProc: a worker slot keeps its worker; an emptied slot is filled by the next worker
// started, or by a worker that fills none.
func TestSlotProc(t *testing.T) {
	h := &harness{cfg: Config{Workers: 2}, procs: map[string]*proc{}}
	add := func(num int) *proc {
		p := &proc{id: fmt.Sprintf("w%d", num), num: num, done: make(chan struct{})}
		h.mu.Lock()
		p.slot = h.freeSlot()
		h.procs[p.id] = p
		h.mu.Unlock()
		return p
	}
	w1, w2, w3 := add(1), add(2), add(3)
	if w1.slot != 0 || w2.slot != 1 || w3.slot != -1 {
		t.Fatalf("slots %d %d %d, want 0 1 -1", w1.slot, w2.slot, w3.slot)
	}
	close(w1.done) // w1 exits: w3, which filled no slot, takes its slot
	if p := h.slotProc(0); p != w3 {
		t.Errorf("slot 0 after w1 exited: %v, want w3", p)
	}
	close(w2.done)
	if w4 := add(4); w4.slot != 1 || h.slotProc(1) != w4 {
		t.Errorf("w4 started into slot %d, want 1", w4.slot)
	}
	// A static member's replacement beside it: the newest answers for the slot.
	w5 := add(5)
	w5.slot = 1
	if p := h.slotProc(1); p != w5 {
		t.Errorf("slot 1 with w4 and w5 in it: %v, want w5", p)
	}
}

// TestEveryFor: "every" leaves out what the services cannot run, and says why.
func TestEveryFor(t *testing.T) {
	one := "postgres://u:p@127.0.0.1:5432/db"
	two := "postgres://u:p@127.0.0.1:5432,127.0.0.1:5434/db?target_session_attrs=read-write"
	kinds, skipped := EveryFor(1, one)
	if slices.Contains(kinds, FaultCoordinatorKill) || slices.Contains(kinds, FaultDBFailover) || skipped[FaultCoordinatorKill] == "" || skipped[FaultDBFailover] == "" {
		t.Errorf("one broker, no standby: kinds %v, skipped %v", kinds, skipped)
	}
	kinds, skipped = EveryFor(3, two)
	if !slices.Contains(kinds, FaultCoordinatorKill) || !slices.Contains(kinds, FaultDBFailover) {
		t.Errorf("a cluster and a standby: kinds %v, skipped %v", kinds, skipped)
	}
	if net := NetSupported(); (net == "") != slices.Contains(kinds, FaultNetFlaky) || skipped[FaultNetFlaky] != net {
		t.Errorf("network kinds: supported %q, kinds %v, skipped %v", net, kinds, skipped)
	}
	if len(kinds)+len(skipped) != len(EveryFault)+len(FailoverFaults)+len(NetFaults) {
		t.Errorf("%d kinds and %d skipped", len(kinds), len(skipped))
	}
}

func TestParseFaultsWeights(t *testing.T) {
	got, err := ParseFaults("freeze*3, kill ,storm*1,delay*2")
	want := []FaultKind{FaultFreeze, FaultKill, FaultStorm, FaultDelay, FaultFreeze, FaultDelay, FaultFreeze}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("ParseFaults = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"freeze*0", "freeze*-2", "freeze*x", "freeze*", "freeze*1001", "bogus*2"} {
		if _, err := ParseFaults(bad); err == nil {
			t.Errorf("ParseFaults(%q) accepted", bad)
		}
	}
	sched := planSchedule(5, got, 200, 2, 3, 1, time.Second)
	n := map[FaultKind]int{}
	for _, f := range sched {
		n[f.Kind]++
	}
	if n[FaultFreeze] < 2*n[FaultKill] || n[FaultStorm] == 0 {
		t.Errorf("200 faults drawn from freeze*3,kill,storm,delay*2: %v; want freeze about three times as often as kill, storm at least once", n)
	}
}
