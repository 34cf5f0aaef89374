package consumer

import (
	"fmt"
	"hash/maphash"
	"strings"
)

// stateSet indexes the explored states without a second copy of each: an open-addressing hash
// table of indexes into result.nodes (a map keyed by the states would hold them twice).
type stateSet struct {
	seed  maphash.Seed
	slots []int32 // index+1 into result.nodes; 0: empty
	n     int
}

func newStateSet() *stateSet {
	return &stateSet{seed: maphash.MakeSeed(), slots: make([]int32, 1<<16)}
}

// insert returns the index of s in r.nodes and false if it is there, or the index it will
// have (len(r.nodes): the caller appends it) and true.
func (t *stateSet) insert(r *result, s mstate) (int32, bool) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow(r)
	}
	mask := uint64(len(t.slots) - 1)
	for h := maphash.Comparable(t.seed, s) & mask; ; h = (h + 1) & mask {
		switch v := t.slots[h]; {
		case v == 0:
			i := int32(len(r.nodes))
			t.slots[h] = i + 1
			t.n++
			return i, true
		case r.nodes[v-1] == s:
			return v - 1, false
		}
	}
}

func (t *stateSet) grow(r *result) {
	old := t.slots
	t.slots = make([]int32, 2*len(old))
	mask := uint64(len(t.slots) - 1)
	for _, v := range old {
		if v == 0 {
			continue
		}
		h := maphash.Comparable(t.seed, r.nodes[v-1]) & mask
		for t.slots[h] != 0 {
			h = (h + 1) & mask
		}
		t.slots[h] = v
	}
}

// The explorer: breadth-first over every interleaving of the model's steps, deduplicating
// states (mstate is a comparable value, used as a map key), keeping for each state its parent
// and the step that reached it so that a violation prints as the shortest trace to it.

// transition is one enabled step of a state: its label, the state after it, whether it is a
// fault (faults are bounded and excluded from the liveness continuation), and the invariant
// it broke, if any.
type transition struct {
	label     label
	next      mstate
	fault     bool
	violation string
}

type violation struct {
	what  string
	state int32 // the state the violating step reached
}

type result struct {
	states, edges, depth int
	violation            *violation
	stuck                int32 // a reachable state from which the goal is unreachable, or -1

	nodes  []mstate
	parent []int32
	via    []int32 // the index of the step from the parent among its successors
	cfg    modelConfig
}

// explore runs the breadth-first search. It stops at the first invariant violation (the
// shortest one, by breadth-first order), or with a violation naming the bound when the
// exploration outgrows cfg.maxStates or cfg.maxDepth (a protocol whose states never repeat
// must fail in seconds, not fill the machine's memory); otherwise it checks liveness on the
// whole graph.
func explore(cfg modelConfig) *result {
	r := &result{stuck: -1, cfg: cfg}
	index := newStateSet()
	var live [][2]int32 // fault-free edges, for the liveness check
	add := func(s mstate, parent int32, l int32) (int32, bool) {
		i, fresh := index.insert(r, s)
		if !fresh {
			return i, false
		}
		r.nodes = append(r.nodes, s)
		r.parent = append(r.parent, parent)
		r.via = append(r.via, l)
		return i, true
	}
	add(cfg.initial().canonical(), -1, -1)
	depth := make([]int32, 1, 1<<16)
	var buf []transition
	for head := 0; head < len(r.nodes); head++ {
		s := r.nodes[head]
		buf = cfg.successors(s, buf[:0])
		for k, tr := range buf {
			r.edges++
			j, fresh := add(tr.next, int32(head), int32(k))
			if fresh {
				depth = append(depth, depth[head]+1)
				r.depth = max(r.depth, int(depth[j]))
				if r.depth > cfg.maxDepth {
					r.states = len(r.nodes)
					r.violation = &violation{what: fmt.Sprintf("the exploration exceeded its bound of %d steps deep: a step keeps making states never seen (a token or position that grows without end?)", cfg.maxDepth), state: j}
					return r
				}
			}
			if tr.violation != "" {
				if !fresh { // reached before by another path: report the step anyway
					j, _ = r.appendNode(tr.next, int32(head), int32(k))
				}
				r.states = len(r.nodes)
				r.violation = &violation{what: tr.violation, state: j}
				return r
			}
			if !tr.fault {
				live = append(live, [2]int32{int32(head), j})
			}
		}
		if len(r.nodes) > cfg.maxStates {
			r.states = len(r.nodes)
			r.violation = &violation{what: fmt.Sprintf("the exploration exceeded its bound of %d states (depth %d): a step keeps making states never seen (a token or position that grows without end?), or the fault budget is too large for the bound (BATON_MODEL_MAX_STATES raises it)", cfg.maxStates, r.depth), state: int32(head)}
			return r
		}
	}
	r.states = len(r.nodes)
	r.stuck = r.checkLiveness(live)
	return r
}

func (r *result) appendNode(s mstate, parent int32, l int32) (int32, bool) {
	i := int32(len(r.nodes))
	r.nodes = append(r.nodes, s)
	r.parent = append(r.parent, parent)
	r.via = append(r.via, l)
	return i, true
}

// checkLiveness returns the first (shallowest) reachable state from which no fault-free path
// reaches a goal state, or -1: backward reachability from the goal states over the
// fault-free edges.
func (r *result) checkLiveness(live [][2]int32) int32 {
	n := len(r.nodes)
	// Reverse adjacency in compressed form.
	start := make([]int32, n+1)
	for _, e := range live {
		start[e[1]+1]++
	}
	for i := 0; i < n; i++ {
		start[i+1] += start[i]
	}
	pred := make([]int32, len(live))
	fill := append([]int32(nil), start[:n]...)
	for _, e := range live {
		pred[fill[e[1]]] = e[0]
		fill[e[1]]++
	}
	good := make([]bool, n)
	var queue []int32
	for i, s := range r.nodes {
		if r.cfg.goal(s) {
			good[i] = true
			queue = append(queue, int32(i))
		}
	}
	for len(queue) > 0 {
		j := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, i := range pred[start[j]:start[j+1]] {
			if !good[i] {
				good[i] = true
				queue = append(queue, i)
			}
		}
	}
	for i := range good {
		if !good[i] {
			return int32(i)
		}
	}
	return -1
}

// trace prints the path from the initial state to state i, one step per line with the state
// reached.
func (r *result) trace(i int32) string {
	var path []int32
	for j := i; j >= 0; j = r.parent[j] {
		path = append(path, j)
	}
	describing = true
	defer func() { describing = false }()
	var b strings.Builder
	for k := len(path) - 1; k >= 0; k-- {
		j := path[k]
		l := label{kind: stepInit}
		if p := r.parent[j]; p >= 0 {
			l = r.cfg.successors(r.nodes[p], nil)[r.via[j]].label
		}
		fmt.Fprintf(&b, "  %2d. %-44s  %s\n", len(path)-1-k, l, r.nodes[j])
	}
	return b.String()
}

// continuation prints up to n fault-free steps from state i, each to a state not seen on the
// way (the first such successor), to show how a stuck state goes on without progress.
func (r *result) continuation(i int32, n int) string {
	describing = true
	defer func() { describing = false }()
	var b strings.Builder
	b.WriteString("  then, with no further faults (first successor each time):\n")
	seen := map[mstate]bool{r.nodes[i]: true}
	s := r.nodes[i]
	for k := 0; k < n; k++ {
		var next *transition
		for _, tr := range r.cfg.successors(s, nil) {
			if !tr.fault && !seen[tr.next] {
				next = &tr
				break
			}
		}
		if next == nil {
			b.WriteString("      (no step leads to a new state: stuck)\n")
			break
		}
		seen[next.next] = true
		s = next.next
		fmt.Fprintf(&b, "      %-44s  %s\n", next.label, s)
	}
	return b.String()
}
