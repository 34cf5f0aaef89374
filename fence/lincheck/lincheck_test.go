package lincheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/batonhq/baton/fence"
)

// target is a store under test, reduced to the four calls of the history.
type target struct {
	claim   func(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error)
	load    func(ctx context.Context, k fence.Key) (fence.State, error)
	apply   func(ctx context.Context, k fence.Key, t fence.Token, first, last int64) error
	recover func(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant string) (fence.Token, error)
	// effect classifies an error that is not a fence verdict: unknown (the call may have
	// taken effect) or none (it certainly did not); late if an unknown call may still take
	// effect after it returned.
	effect func(ctx context.Context, op opKind, err error) (o outcome, late bool)
}

type opKind int8

const (
	opLoad opKind = iota
	opClaim
	opApply
	opRecover
)

func (k opKind) String() string { return [...]string{"load", "claim", "apply", "recover"}[k] }

// input is one call.
type input struct {
	op       opKind
	key      fence.Key
	tok      fence.Token // claim, apply
	claimant string      // claim, recover
	first    int64       // apply
	last     int64       // apply
	expected fence.Token // recover
	epoch    int64       // recover
}

// outcome is how a call ended.
type outcome int8

const (
	outOK         outcome = iota
	outStale              // *fence.StaleError
	outDuplicate          // fence.ErrDuplicate
	outOverlap            // fence.ErrOverlap
	outNotClaimed         // fence.ErrNotClaimed
	outConflict           // fence.ErrConflict
	outInvalid            // fence.ErrInvalid
	outNoEffect           // failed before anything could commit (e.g. the request was never sent)
	outUnknown            // may or may not have taken effect
)

func (o outcome) String() string {
	return [...]string{"ok", "stale", "duplicate", "overlap", "not-claimed", "conflict", "invalid", "no-effect", "unknown"}[o]
}

type output struct {
	out   outcome
	state fence.State // load, claim (when ok)
	tok   fence.Token // recover (when ok)
	err   string      // the error, for the report
	// late: an unknown outcome that may still take effect after the call returned (its
	// context expired while the request was in flight): its return is at the end of time.
	// Otherwise an unknown call took effect before it returned, or never.
	late bool
}

// verdict maps a fence error to its outcome; ok=false for any other error.
func verdict(err error) (outcome, bool) {
	switch {
	case err == nil:
		return outOK, true
	case errors.Is(err, fence.ErrStale):
		return outStale, true
	case errors.Is(err, fence.ErrDuplicate):
		return outDuplicate, true
	case errors.Is(err, errOverlap):
		return outOverlap, true
	case errors.Is(err, errNotClaimed):
		return outNotClaimed, true
	case errors.Is(err, fence.ErrConflict):
		return outConflict, true
	case errors.Is(err, fence.ErrInvalid):
		return outInvalid, true
	}
	return 0, false
}

// mstate is the sequential model's state of one fence: fence.State (whose Claimant names the
// holder of the token).
type mstate = fence.State

func initialState() mstate { return mstate{Position: fence.NoPosition} }

// step is the sequential specification of one fence: the states a call can leave behind
// when it returned out in state s, by the fencecheck rules; none if out is impossible.
func step(s mstate, in input, out output) []mstate {
	want, next := expect(s, in)
	switch out.out {
	case outUnknown: // it took effect, or it did not
		if next == s {
			return []mstate{s}
		}
		return []mstate{next, s}
	case outNoEffect:
		return []mstate{s}
	case want.out:
	default:
		return nil
	}
	switch {
	case in.op == opLoad && !sameState(out.state, s):
		return nil
	case in.op == opClaim && out.out == outOK && !sameState(out.state, next):
		return nil
	case in.op == opRecover && out.out == outOK && out.tok != next.Token:
		return nil
	}
	return []mstate{next}
}

// expect computes the result of in in state s and the state afterwards, with the fencecheck
// rules.
func expect(s mstate, in input) (output, mstate) {
	switch in.op {
	case opLoad:
		return output{out: outOK, state: s}, s
	case opClaim:
		if o, ok := verdict(checkClaim(in.key, s, in.tok, in.claimant)); !ok || o != outOK {
			return output{out: o}, s
		}
		n := claimed(s, in.tok, in.claimant)
		return output{out: outOK, state: n}, n
	case opApply:
		if o, ok := verdict(checkAdvance(in.key, s, in.tok, in.first, in.last)); !ok || o != outOK {
			return output{out: o}, s
		}
		n := s
		n.Token = in.tok
		n.Position = in.last
		return output{out: outOK}, n
	case opRecover:
		if s.Token != in.expected {
			return output{out: outConflict}, s
		}
		n := s
		n.Token = fence.Token{Era: in.expected.Era + 1, Epoch: in.epoch}
		n = recovered(n, in.claimant)
		return output{out: outOK, tok: n.Token}, n
	}
	panic("unknown op")
}

var model = (&porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[fence.Key][]porcupine.Operation{}
		var keys []fence.Key
		for _, op := range h {
			k := op.Input.(input).key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []any { return []any{initialState()} },
	Step: func(s, in, out any) []any {
		var next []any
		for _, n := range step(s.(mstate), in.(input), out.(output)) {
			next = append(next, n)
		}
		return next
	},
	Equal: func(a, b any) bool { return a.(mstate) == b.(mstate) },
	DescribeOperation: func(in, out any) string {
		i, o := in.(input), out.(output)
		var call string
		switch i.op {
		case opLoad:
			call = "Load()"
		case opClaim:
			call = fmt.Sprintf("Claim(%s, %s)", i.tok, i.claimant)
		case opApply:
			call = fmt.Sprintf("Apply(%s, %d..%d)", i.tok, i.first, i.last)
		case opRecover:
			call = fmt.Sprintf("Recover(%s, epoch %d, %s)", i.expected, i.epoch, i.claimant)
		}
		res := o.out.String()
		switch {
		case o.out == outOK && (i.op == opLoad || i.op == opClaim):
			res = describeState(o.state)
		case o.out == outOK && i.op == opRecover:
			res = o.tok.String()
		}
		return call + " -> " + res
	},
	DescribeState: func(s any) string { return describeState(s.(mstate)) },
}).ToModel()

// history records the calls of concurrent clients, with call and return instants on one
// monotonic clock.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	count [9]int // by outcome
}

func newHistory() *history { return &history{start: time.Now()} }

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in input, call int64, out output) {
	ret := h.now()
	if out.late {
		ret = math.MaxInt64 // it may take effect at any instant after its call
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	h.count[out.out]++
}

func (h *history) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

func (h *history) outcomes(o outcome) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count[o]
}

func (h *history) summary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var parts []string
	for o, n := range h.count {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", outcome(o), n))
		}
	}
	return fmt.Sprintf("%d calls (%s)", len(h.ops), strings.Join(parts, " "))
}

// check runs porcupine on the history and fails the test with a visualization file if it is
// not linearizable.
func (h *history) check(t *testing.T) {
	t.Helper()
	res, info := h.linearizable(t)
	switch res {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		t.Fatalf("porcupine timed out after 60s on %s: shorten the history", h.summary())
	}
	path := filepath.Join(t.TempDir(), "history.html")
	if dir := os.Getenv("BATON_LINCHECK_OUT"); dir != "" {
		path = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".html")
	}
	if f, err := os.Create(path); err == nil {
		_ = porcupine.Visualize(model, info, f)
		_ = f.Close()
	}
	t.Fatalf("history is not linearizable against the fence model (visualization: %s); longest linearizable prefixes:\n%s", path, describePartial(info))
}

func (h *history) linearizable(t *testing.T) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	t.Helper()
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 60*time.Second)
	t.Logf("porcupine: %s in %v: %s", res, time.Since(start).Round(time.Millisecond), h.summary())
	return res, info
}

func describePartial(info porcupine.LinearizationInfo) string {
	var b strings.Builder
	for p, lins := range info.PartialLinearizationsOperations() {
		longest := []porcupine.Operation(nil)
		for _, l := range lins {
			if len(l) > len(longest) {
				longest = l
			}
		}
		if len(longest) == 0 {
			continue
		}
		fmt.Fprintf(&b, "partition %d, %d calls:\n", p, len(longest))
		for _, op := range longest[max(0, len(longest)-12):] {
			fmt.Fprintf(&b, "  c%d %s\n", op.ClientId, model.DescribeOperation(op.Input, op.Output))
		}
	}
	return b.String()
}

// workload drives clients against tgt until ctx ends or each has made calls calls. Each
// client is one claimant that picks its next call from what it last observed, so that the
// calls hit every verdict: successes, stale, duplicate, overlap, not claimed, conflicts.
type workload struct {
	keys     []fence.Key
	clients  int
	calls    int
	opTimout time.Duration
	// shortEvery: one call in shortEvery (on average) gets a deadline of short instead, to
	// cancel it mid-statement; 0: none.
	shortEvery int
	short      time.Duration
	// tgt returns the target to use for the next call (a fault may swap it).
	tgt func() *target
	// pace is slept after a call that failed with an infrastructure error.
	pace time.Duration
	// more, if set, keeps the clients going past calls until it returns false (a fault
	// has not happened yet, or too few calls followed it).
	more func() bool
}

type clientView struct {
	st   fence.State // the last state this client observed for each key
	tok  fence.Token // the last token it holds (claimed or recovered)
	seen bool
}

func (w workload) run(ctx context.Context, h *history, seed uint64) {
	var wg sync.WaitGroup
	for c := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			claimant := fmt.Sprintf("c%d", c)
			views := make([]clientView, len(w.keys))
			for i := 0; i < w.calls || (w.more != nil && w.more()); i++ {
				if ctx.Err() != nil {
					return
				}
				ki := rng.IntN(len(w.keys))
				in := w.next(rng, w.keys[ki], claimant, &views[ki])
				out := w.call(ctx, h, c, in)
				w.observe(&views[ki], in, out)
				if out.out == outNoEffect || out.out == outUnknown {
					select {
					case <-ctx.Done():
					case <-time.After(w.pace):
					}
				}
			}
		}()
	}
	wg.Wait()
}

func (w workload) next(rng *rand.Rand, k fence.Key, claimant string, v *clientView) input {
	in := input{key: k, claimant: claimant}
	small := func(base int64) int64 { return max(0, base+int64(rng.IntN(3))-1) } // base-1..base+1
	switch r := rng.IntN(100); {
	case r < 15 || !v.seen:
		in.op = opLoad
	case r < 40:
		in.op = opClaim
		in.tok = fence.Token{Era: v.st.Token.Era, Epoch: small(v.st.Token.Epoch) + int64(rng.IntN(2))}
		if rng.IntN(20) == 0 {
			in.tok.Era++ // a later era: always invalid
		}
	case r < 88:
		in.op = opApply
		in.tok = v.tok
		switch rng.IntN(8) {
		case 0, 1:
			in.tok = v.st.Token
		case 2:
			in.tok.Epoch++ // not claimed
		}
		in.first = small(v.st.Position + 1)
		in.last = in.first + int64(rng.IntN(3))
	default:
		in.op = opRecover
		in.expected = v.st.Token
		if rng.IntN(4) == 0 {
			in.expected.Epoch = small(in.expected.Epoch)
		}
		in.epoch = int64(1 + rng.IntN(3))
	}
	return in
}

func (w workload) observe(v *clientView, in input, out output) {
	switch {
	case out.out != outOK:
	case in.op == opLoad:
		v.st, v.seen = out.state, true
	case in.op == opClaim:
		v.st, v.tok = out.state, in.tok
	case in.op == opApply:
		v.st.Position = in.last
	case in.op == opRecover:
		v.st.Token, v.tok = out.tok, out.tok
	}
}

func (w workload) call(ctx context.Context, h *history, client int, in input) output {
	tgt := w.tgt()
	timeout := w.opTimout
	if w.shortEvery > 0 && rand.IntN(w.shortEvery) == 0 {
		timeout = w.short
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	call := h.now()
	var out output
	var err error
	switch in.op {
	case opLoad:
		out.state, err = tgt.load(ctx, in.key)
	case opClaim:
		out.state, err = tgt.claim(ctx, in.key, in.tok, in.claimant)
	case opApply:
		err = tgt.apply(ctx, in.key, in.tok, in.first, in.last)
	case opRecover:
		out.tok, err = tgt.recover(ctx, in.key, in.expected, in.epoch, in.claimant)
	}
	if o, ok := verdict(err); ok {
		out.out = o
	} else {
		out.out, out.late = tgt.effect(ctx, in.op, err)
		if in.op == opLoad {
			return out // a failed read has no effect and observes nothing: not recorded
		}
	}
	if err != nil {
		out.err = err.Error()
	}
	h.add(client, in, call, out)
	return out
}

func describeState(s mstate) string {
	return fmt.Sprintf("{%s pos=%d%s}", s.Token, s.Position, claimantSuffix(s))
}

// sameState compares the parts of a state a call returns.
func sameState(a, b mstate) bool { return a == b }

// The data each Apply writes in its transaction, one row per batch: the fence promises that it
// commits exactly when the fence advances.
const (
	createData       = `CREATE TABLE lin_data (part integer NOT NULL, first bigint NOT NULL, last bigint NOT NULL, era bigint NOT NULL, epoch bigint NOT NULL)`
	insertData       = `INSERT INTO lin_data (part, first, last, era, epoch) VALUES ($1, $2, $3, $4, $5)`
	selectData       = `SELECT first, last, era, epoch FROM lin_data WHERE part = $1 ORDER BY first`
	insertDataSQLite = `INSERT INTO lin_data (part, first, last, era, epoch) VALUES (?, ?, ?, ?, ?)`
	selectDataSQLite = `SELECT first, last, era, epoch FROM lin_data WHERE part = ? ORDER BY first`
)

type dataRow struct {
	first, last int64
	tok         fence.Token
}

// checkData checks the batches the Apply calls committed with their fence advances: no two
// overlap (no record applied twice), tokens never go down along the positions, the last
// one ends at the fence's final position, and every Apply that returned success has its row.
func checkData(t *testing.T, h *history, keys []fence.Key, rows func(part int32) ([]dataRow, error), load func(fence.Key) (fence.State, error)) {
	t.Helper()
	for _, k := range keys {
		got, err := rows(k.Partition)
		if err != nil {
			t.Fatalf("read the data of %s: %v", k, err)
		}
		st, err := load(k)
		if err != nil {
			t.Fatalf("load %s: %v", k, err)
		}
		have := map[dataRow]bool{}
		last := fence.NoPosition
		var tok fence.Token
		for _, d := range got {
			if d.first <= last {
				t.Fatalf("%s: batch %d..%d under %s overlaps the batch ending at %d: records applied twice", k, d.first, d.last, d.tok, last)
			}
			if d.tok.Compare(tok) < 0 {
				t.Fatalf("%s: batch %d..%d committed under %s after a batch under %s", k, d.first, d.last, d.tok, tok)
			}
			last, tok = d.last, d.tok
			have[d] = true
		}
		if last != st.Position {
			t.Fatalf("%s: the data ends at %d, the fence at %d", k, last, st.Position)
		}
		h.mu.Lock()
		for _, op := range h.ops {
			in, out := op.Input.(input), op.Output.(output)
			if in.key == k && in.op == opApply && out.out == outOK && !have[dataRow{in.first, in.last, in.tok}] {
				h.mu.Unlock()
				t.Fatalf("%s: Apply(%s, %d..%d) returned success but its data is not there", k, in.tok, in.first, in.last)
			}
		}
		h.mu.Unlock()
		t.Logf("%s: %d batches committed, position %d", k, len(got), st.Position)
	}
}
