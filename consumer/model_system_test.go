package consumer

import (
	"fmt"
	"strings"

	"github.com/batonhq/baton/fence"
)

// The model. One partition P of a log of logLen records, a consumer group with a coordinator,
// and `slots` member processes, each running at most one partition worker for P. Every step
// is atomic; a process "pauses" simply by not being scheduled, so every delay of every
// process is among the interleavings.
//
// Coordinator: an incarnation (group deletion and recreation starts a new one), a generation,
// the member id of each process (coordinator-generated, unique for ever: a member of an old
// incarnation is unknown to a new one), the owner of P at the current generation, and a
// loading flag (the coordinator moved and is loading the group).
//
// Faults (bounded by cfg.faults): a rebalance (P moves or is retained), a session expiry, a
// process joining, a static member replaced by a new process at the same generation, group
// deletion and recreation, the coordinator starting to load, and a lost reply of a sink write
// (the write committed, the worker did not hear). Revocations and "partition lost" are
// delivered to a worker after an arbitrary delay (a non-fault step), so a paused former
// owner keeps running its protocol: a zombie.
//
// The sink steps call the real fencestore rules; the worker steps call the consumer's real
// claim decision (see model_proto_test.go).

const (
	slots  = 3 // member processes
	logLen = 2 // records in P: offsets 0..logLen-1
)

type tok8 struct{ era, epoch int8 }

func (t tok8) token() fence.Token { return fence.Token{Era: int64(t.era), Epoch: int64(t.epoch)} }
func tok8of(t fence.Token) tok8   { return tok8{era: int8(t.Era), epoch: int8(t.Epoch)} }
func (t tok8) less(u tok8) bool   { return t.token().Less(u.token()) }
func (t tok8) String() string     { return t.token().String() }
func claimantOf(id int8) string   { return fmt.Sprintf("w%d", id) }
func (s *mstate) sinkState() fence.State {
	return fence.State{Token: s.sTok.token(), Position: int64(s.sPos)}
}

// wstate is one partition worker: an incarnation of the claim path and the apply loop.
type wstate struct {
	id      int8 // claimant id, unique for ever; 0: no worker in this slot
	pc      pc
	member  int8 // the member id this worker's process had when P was assigned
	epoch   int8 // the epoch the worker's tokens carry
	tok     tok8 // the token it claimed (valid in pcRun)
	pos     int8 // the last position it knows applied
	ours    tok8 // legacy: the token this worker last claimed or recovered to
	seen    tok8 // the stored token of the last refusal (Recover's expected)
	revoked bool // a revocation or loss is pending delivery
}

type pc int8

const (
	pcNone    pc = iota // no worker
	pcLoad              // about to Load
	pcClaim             // about to Claim w.tok
	pcVerify            // about to ask the coordinator
	pcRecover           // about to Recover from w.seen
	pcRun               // claimed: applying batches
	pcStopped           // gave up on P: idles until revoked
)

func (p pc) String() string {
	return [...]string{"-", "load", "claim", "verify", "recover", "run", "stopped"}[p]
}

// mstate is the whole system state. It is comparable: the explorer dedups on it.
type mstate struct {
	faults     int8
	inc        int8 // group incarnation
	gen        int8 // current generation
	loading    bool
	owner      int8        // slot that owns P at gen, -1: none
	member     [slots]int8 // member id of each process in the group, 0: not a member
	nextMember int8
	nextWorker int8

	sTok      tok8 // the sink's fence for P
	sClaimant int8
	sPos      int8

	// Ghost state, for the invariants only.
	applied      [logLen]int8 // how many times each offset was committed
	maxCommit    tok8         // the highest token that committed
	ownerClaimed bool         // the current owner's worker has taken the fence since P moved
	w            [slots]wstate
}

func (s mstate) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "inc=%d gen=%d owner=%d", s.inc, s.gen, s.owner)
	if s.loading {
		b.WriteString(" LOADING")
	}
	fmt.Fprintf(&b, " members=%v sink={%s %s pos=%d} applied=%v |", s.member, s.sTok, claimantOf(s.sClaimant), s.sPos, s.applied)
	for i, w := range s.w {
		if w.id == 0 {
			continue
		}
		fmt.Fprintf(&b, " p%d:w%d[m%d e%d %s", i, w.id, w.member, w.epoch, w.pc)
		if w.pc == pcRun {
			fmt.Fprintf(&b, " %s@%d", w.tok, w.pos)
		}
		if w.revoked {
			b.WriteString(" revoke-pending")
		}
		b.WriteString("]")
	}
	return b.String()
}

type stepKind int8

const (
	stepInit stepKind = iota
	stepRebalance
	stepExpire
	stepJoin
	stepStaticReplace
	stepRecreate
	stepLoadStart
	stepLoadEnd
	stepRevoke
	stepWorker
	stepWorkerReplyLost
)

type label struct {
	kind      stepKind
	slot, arg int8
	what      string // the worker step's description
}

func (l label) String() string {
	switch l.kind {
	case stepInit:
		return "initial"
	case stepRebalance:
		return fmt.Sprintf("FAULT rebalance: P to p%d", l.slot)
	case stepExpire:
		return fmt.Sprintf("FAULT session of p%d expires; P to p%d", l.slot, l.arg)
	case stepJoin:
		return fmt.Sprintf("FAULT p%d joins; P to p%d", l.slot, l.arg)
	case stepStaticReplace:
		return fmt.Sprintf("FAULT static p%d replaced by p%d (same gen)", l.slot, l.arg)
	case stepRecreate:
		return fmt.Sprintf("FAULT group deleted+recreated; P to p%d", l.slot)
	case stepLoadStart:
		return "FAULT coordinator moves: loading"
	case stepLoadEnd:
		return "coordinator loaded"
	case stepRevoke:
		return fmt.Sprintf("p%d: revoke/lost delivered", l.slot)
	case stepWorkerReplyLost:
		return fmt.Sprintf("FAULT p%d: %s (reply lost)", l.slot, l.what)
	}
	return fmt.Sprintf("p%d: %s", l.slot, l.what)
}

type modelConfig struct {
	faults    int
	maxStates int
	proto     protocol
	allow     faultSet // the fault kinds explored; 0: all
}

// faultSet is a set of fault kinds (bits 1<<stepKind).
type faultSet uint32

func faultsOf(kinds ...stepKind) faultSet {
	var f faultSet
	for _, k := range kinds {
		f |= 1 << k
	}
	return f
}

func (c modelConfig) allows(k stepKind) bool { return c.allow == 0 || c.allow&(1<<k) != 0 }

func (c modelConfig) String() string {
	return fmt.Sprintf("{protocol %s, %d processes, %d records, %d faults}", c.proto.name, slots, logLen, c.faults)
}

func defaultModel() modelConfig {
	return modelConfig{faults: 3, maxStates: 20_000_000, proto: realProtocol()}
}

// initial: processes 0 and 1 are members of incarnation 1 at generation 1, P assigned to
// process 0; process 2 is a spare (a static replacement, a late joiner).
func (c modelConfig) initial() mstate {
	s := mstate{inc: 1, gen: 1, owner: -1, nextMember: 1, nextWorker: 1, sPos: int8(fence.NoPosition)}
	s.member[0], s.member[1] = 1, 2
	s.nextMember = 3
	s.assign(0)
	return s
}

func (s *mstate) active(i int) bool { return s.w[i].id != 0 }

// current reports whether the worker in slot i belongs to the coordinator's current owner of
// P: its process owns P at the current generation and is still the member it was when P was
// assigned.
func (s *mstate) current(i int) bool {
	return s.active(i) && int(s.owner) == i && s.member[i] != 0 && s.w[i].member == s.member[i]
}

// assign gives P to slot j at the current generation: retained if j's worker already owns it
// (cooperative-sticky: no new assignment callback, the worker keeps its epoch), otherwise
// the previous owner's worker gets a pending revocation and j a new worker.
func (s *mstate) assign(j int) {
	if int(s.owner) == j && s.current(j) && !s.w[j].revoked {
		return
	}
	if o := int(s.owner); o >= 0 && o != j && s.active(o) {
		s.w[o].revoked = true
	}
	s.ownerClaimed = false
	s.owner = int8(j)
	s.w[j] = wstate{id: s.nextWorker, pc: pcLoad, member: s.member[j], epoch: s.gen, pos: int8(fence.NoPosition)}
	s.nextWorker++
}

func (s *mstate) members() []int {
	var m []int
	for i := range slots {
		if s.member[i] != 0 {
			m = append(m, i)
		}
	}
	return m
}

// goal: the current owner's worker holds the fence and has applied the whole log.
func (c modelConfig) goal(s mstate) bool {
	o := int(s.owner)
	return o >= 0 && s.current(o) && s.w[o].pc == pcRun && s.sClaimant == s.w[o].id && s.sPos == logLen-1 && s.w[o].pos == logLen-1
}

func (c modelConfig) successors(s mstate, out []transition) []transition {
	emit := func(l label, n mstate, fault bool, v string) {
		if fault {
			n.faults++
		}
		out = append(out, transition{label: l, next: n, fault: fault, violation: v})
	}
	if int(s.faults) < c.faults {
		out = c.faultSteps(s, out)
	}
	if s.loading {
		n := s
		n.loading = false
		emit(label{kind: stepLoadEnd}, n, false, "")
	}
	for i := range slots {
		if !s.active(i) {
			continue
		}
		if s.w[i].revoked {
			n := s
			n.w[i] = wstate{}
			emit(label{kind: stepRevoke, slot: int8(i)}, n, false, "")
		}
		for _, ws := range c.proto.step(s, i, int(s.faults) < c.faults && c.allows(stepWorkerReplyLost)) {
			kind := stepWorker
			if ws.replyLost {
				kind = stepWorkerReplyLost
			}
			emit(label{kind: kind, slot: int8(i), what: ws.what}, ws.next, ws.replyLost, ws.violation)
		}
	}
	return out
}

func (c modelConfig) faultSteps(s mstate, out []transition) []transition {
	emit := func(l label, n mstate) {
		n.faults++
		out = append(out, transition{label: l, next: n, fault: true})
	}
	ms := s.members()
	for _, j := range ms { // a rebalance: P moves to j or is retained by j
		if !c.allows(stepRebalance) {
			break
		}
		n := s
		n.gen++
		n.assign(j)
		emit(label{kind: stepRebalance, slot: int8(j)}, n)
	}
	for _, i := range ms { // i's session expires (it paused); P goes to another member
		if !c.allows(stepExpire) {
			break
		}
		for _, j := range ms {
			if j == i {
				continue
			}
			n := s
			n.member[i] = 0
			if int(n.owner) == i {
				n.owner = -1
			}
			n.gen++
			n.assign(j)
			emit(label{kind: stepExpire, slot: int8(i), arg: int8(j)}, n)
		}
	}
	for i := range slots { // a process that is not a member joins (its old worker is gone)
		if s.member[i] != 0 || s.active(i) || !c.allows(stepJoin) {
			continue
		}
		for _, j := range append([]int{i}, ms...) {
			n := s
			n.member[i] = n.nextMember
			n.nextMember++
			n.gen++
			n.assign(j)
			emit(label{kind: stepJoin, slot: int8(i), arg: int8(j)}, n)
		}
	}
	for _, i := range ms { // static member i replaced by a new process k without a rebalance
		if !c.allows(stepStaticReplace) {
			break
		}
		for k := range slots {
			if s.member[k] != 0 || s.active(k) {
				continue
			}
			n := s
			n.member[k] = n.nextMember
			n.nextMember++
			n.member[i] = 0
			if int(n.owner) == i {
				n.owner = -1
				if n.active(i) {
					n.w[i].revoked = true
				}
				n.assign(k) // at the same generation
			}
			emit(label{kind: stepStaticReplace, slot: int8(i), arg: int8(k)}, n)
		}
	}
	if s.inc == 1 && c.allows(stepRecreate) { // the group is deleted (all sessions gone) and recreated, generation from 1
		for _, j := range ms {
			n := s
			n.inc++
			n.gen = 1
			for _, i := range ms {
				n.member[i] = n.nextMember
				n.nextMember++
			}
			for i := range slots {
				if n.active(i) {
					n.w[i].revoked = true
				}
			}
			n.owner = -1
			n.assign(j)
			emit(label{kind: stepRecreate, slot: int8(j)}, n)
		}
	}
	if !s.loading && c.allows(stepLoadStart) {
		n := s
		n.loading = true
		emit(label{kind: stepLoadStart}, n)
	}
	return out
}

// commit applies a batch [first, last] under the worker in slot i's token to the sink and
// checks the write invariants; it returns the violated invariant, if any.
func (s *mstate) commit(i int, first, last int8) string {
	w := &s.w[i]
	var v []string
	if w.tok.less(s.maxCommit) {
		v = append(v, fmt.Sprintf("commit under %s after a commit under the higher %s", w.tok, s.maxCommit))
	}
	if first > s.sPos+1 {
		v = append(v, fmt.Sprintf("offsets %d..%d skipped", s.sPos+1, first-1))
	}
	for o := first; o <= last; o++ {
		s.applied[o]++
		if s.applied[o] > 1 {
			v = append(v, fmt.Sprintf("offset %d applied %d times", o, s.applied[o]))
		}
	}
	if !s.current(i) && s.ownerClaimed {
		v = append(v, fmt.Sprintf("two writers: w%d (not current) commits after the current owner took the fence", w.id))
	}
	if s.maxCommit.less(w.tok) {
		s.maxCommit = w.tok
	}
	s.sTok, s.sClaimant, s.sPos = w.tok, w.id, last
	w.pos = last
	return strings.Join(v, "; ")
}

// took records that the worker in slot i took the fence (claim or recover) and checks the
// era invariant for a recovery.
func (s *mstate) took(i int, t tok8, recovered bool) string {
	var v string
	if recovered && !s.current(i) {
		v = fmt.Sprintf("era raised to %s by w%d, which is not the current owner", t, s.w[i].id)
	}
	s.sTok, s.sClaimant = t, s.w[i].id
	if s.current(i) {
		s.ownerClaimed = true
	}
	return v
}
