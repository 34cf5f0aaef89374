package consumer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/claimant"
	"github.com/batonhq/baton/internal/fencecheck"
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
// The sink steps call the real fencecheck rules; the worker steps call the consumer's real
// claim decision (see model_proto_test.go).

const (
	slots  = 3 // member processes
	logLen = 2 // records in P: offsets 0..logLen-1

	maxRows = logLen + 1 // outbox rows (one per applied record; +1 so a double apply shows)
	maxMsgs = 2          // published messages not yet consumed by the receiver
)

// orow is an outbox row, appended under tok. Its sequence is its index + 1.
type orow struct{ tok tok8 }

// omsg is a published outbox message: the row's original token and sequence.
type omsg struct {
	tok tok8
	seq int8
}

type tok8 struct{ era, epoch int8 }

func (t tok8) token() fence.Token { return fence.Token{Era: int64(t.era), Epoch: int64(t.epoch)} }
func (t tok8) less(u tok8) bool   { return t.token().Compare(u.token()) < 0 }
func (t tok8) String() string     { return t.token().String() }
func tok8of(t fence.Token) tok8   { return tok8{era: int8(t.Era), epoch: int8(t.Epoch)} }

// Every process is a static member: its group.instance.id (inst) is its identity, which a
// static replacement hands to the replacing process. identityName is the real identity of
// instance i (internal/claimant), and claimantOf a claimant of that identity in claimant.New's shape,
// with the worker id in place of the random bits.
func identityName(inst int8) string {
	if inst == 0 {
		return ""
	}
	return claimant.Identity(fmt.Sprintf("i%d", inst), "")
}
func claimantOf(id, inst int8) string { return fmt.Sprintf("%s/%016x", identityName(inst), id) }
func (s *mstate) sinkState() fence.State {
	st := fence.State{Token: s.sTok.token(), Position: int64(s.sPos)}
	if s.sClaimant != 0 {
		st.Claimant = claimantOf(s.sClaimant, s.sInst)
	}
	return st
}

// wstate is one partition worker: an incarnation of the claim path and the apply loop.
type wstate struct {
	id      int8 // claimant id, unique for ever; 0: no worker in this slot
	pc      pc
	member  int8 // the member id this worker's process had when P was assigned
	inst    int8 // the instance id (identity) of this worker's process when P was assigned
	epoch   int8 // the epoch the worker's tokens carry
	tok     tok8 // the token it claimed (valid in pcRun)
	pos     int8 // the last position it knows applied
	seen    tok8 // the stored token of the last refusal (Recover's expected)
	revoked bool // a revocation or loss is pending delivery
	// claimedOK: the last claim succeeded (the proof that follows leads to applying);
	// proof: ghost, whether the last proof of currentness was sound.
	claimedOK bool
	proof     int8
	// The rest of the decision's claimState, and the pending step's arguments.
	refused              bool
	conflicts, rederived int8
	vepoch               int8 // opVerify, opRecover: the epoch
	exp                  tok8 // opRecover: the expected token
	// tview: the topic incarnation this worker's last topic comparison saw (0: none);
	// confirm: the decision's pending Load confirms the claimed token (w.tok).
	tview   int8
	confirm bool
	// identify: the decision's pending Load reads who holds the equal token a claim was
	// refused; handover: it was held by a claimant of this worker's identity.
	// equal: the last refusal was of the very token stored.
	identify, handover, equal bool
	norec                     bool // RecoverRegressions(false) (constant per run)
	// The relay (outbox steps): the pending rows it read under its token and not yet marked.
	rfrom, rto int8 // sequences rfrom..rto; rto == 0: none read
	published  bool // rfrom..rto were produced, not yet marked
}

const (
	proofNone int8 = iota
	proofSound
	proofUnsound
)

type pc int8

const (
	pcNone    pc = iota // no worker
	pcLoad              // about to Load
	pcClaim             // about to Claim w.tok
	pcVerify            // about to ask the coordinator
	pcRecover           // about to Recover from w.seen
	pcRun               // claimed: applying batches
	pcStopped           // gave up on P: idles until revoked
	pcTopic             // about to compare the topic with the identity stored with the fences
	pcHold              // the topic was recreated or grown: holds, looks again later
)

func (p pc) String() string {
	return [...]string{"-", "load", "claim", "verify", "recover", "run", "stopped", "topic", "hold"}[p]
}

// mstate is the whole system state. It is comparable: the explorer dedups on it.
type mstate struct {
	outbox     bool // the outbox is modelled (constant)
	faults     int8
	inc        int8 // group incarnation
	gen        int8 // current generation
	loading    bool
	owner      int8        // slot that owns P at gen, -1: none
	member     [slots]int8 // member id of each process in the group, 0: not a member
	inst       [slots]int8 // instance id of each process (static members: a permutation of 1..slots)
	norec      bool        // RecoverRegressions(false) (constant)
	nextMember int8
	nextWorker int8

	sTok      tok8 // the sink's fence for P
	sClaimant int8
	sInst     int8 // the identity (instance) of sClaimant's process
	sPos      int8

	// The topic (cfg.topics): the incarnation that exists (deleting and recreating it starts
	// a new one, with a new ID and a new log) and its partition count; the identity the sink
	// stores with the fences (sTopic 0: none yet) and its acknowledged partition count. P is
	// partition 0; growth adds partition 1 (Q), to which the key of P's log moves: Q's log
	// holds the key's later records. Q's worker is abstract: its claim and proof are P's
	// protocol again; only its topic step (the real rule and decision) and its apply are
	// modelled (qpc).
	tinc, parts   int8
	sTopic, sPart int8
	qpc           int8 // Q's worker: 0 none, qTopic, qHold, qRun, qDone

	// The outbox (cfg.outbox): rows next to the fence, the relay cursor, the destination
	// topic's unconsumed messages, and the receiver's inbox for the key.
	rows      [maxRows]orow
	nrows     int8
	delivered int8 // rows 1..delivered are marked delivered
	msgs      [maxMsgs]omsg
	nmsgs     int8
	inTok     tok8 // the inbox's stored (token, seq); inSeq 0: nothing admitted
	inSeq     int8

	// Ghost state, for the invariants only.
	applied      [logLen]int8 // how many times each offset (of the current incarnation) was committed
	sPosInc      int8         // the topic incarnation whose offsets the sink's position counts
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
	fmt.Fprintf(&b, " members=%v instances=%v sink={%s w%d(i%d) pos=%d} applied=%v", s.member, s.inst, s.sTok, s.sClaimant, s.sInst, s.sPos, s.applied)
	if s.tinc > 0 {
		fmt.Fprintf(&b, " topic={inc %d, %d partitions; stored inc %d, %d partitions; position of inc %d} Q=%s",
			s.tinc, s.parts, s.sTopic, s.sPart, s.sPosInc, [...]string{"-", "topic", "hold", "run", "done"}[s.qpc])
	}
	if s.nrows > 0 || s.nmsgs > 0 || s.inSeq > 0 {
		fmt.Fprintf(&b, " outbox={rows %d delivered %d} topic=%v inbox={%s seq %d}", s.nrows, s.delivered, s.msgs[:s.nmsgs], s.inTok, s.inSeq)
	}
	b.WriteString(" |")
	for i, w := range s.w {
		if w.id == 0 {
			continue
		}
		fmt.Fprintf(&b, " p%d:w%d[m%d i%d e%d %s", i, w.id, w.member, w.inst, w.epoch, w.pc)
		if w.tview != 0 {
			fmt.Fprintf(&b, " t%d", w.tview)
		}
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
	stepRelay
	stepAdmit
	stepTopicRecreate // the topic is deleted and recreated (a fault)
	stepGrow          // the topic is grown from 1 to 2 partitions (a fault)
	stepOperator      // an operator resets a recreated topic, or acknowledges growth after draining
	stepQ             // Q's worker
)

type label struct {
	kind      stepKind
	slot, arg int8
	what      string // the worker step's description (only while describing)
}

// describing turns on the step descriptions: off while exploring (formatting them costs more
// than the rest of a step), on while a trace is printed (the explorer recomputes the steps of
// the trace's states).
var describing bool

func sayf(format string, args ...any) string {
	if !describing {
		return ""
	}
	return fmt.Sprintf(format, args...)
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
	case stepAdmit:
		return "receiver: " + l.what
	case stepRelay:
		return fmt.Sprintf("p%d relay: %s", l.slot, l.what)
	case stepTopicRecreate:
		return "FAULT topic deleted and recreated (new ID, new log)"
	case stepGrow:
		return "FAULT topic grown: the key moves from P to the new partition Q"
	case stepOperator, stepQ:
		return l.what
	case stepWorkerReplyLost:
		return fmt.Sprintf("FAULT p%d: %s (reply lost)", l.slot, l.what)
	}
	return fmt.Sprintf("p%d: %s", l.slot, l.what)
}

type modelConfig struct {
	faults int
	// maxStates and maxDepth bound the exploration: past either, explore reports a violation
	// naming the bound. The CI explorations stay well inside them (the largest, TestModel's, at
	// about 2.6 million states and depth 36).
	maxStates int
	maxDepth  int
	proto     protocol
	allow     faultSet // the fault kinds explored; 0: all
	outbox    bool     // model the outbox: append, relay (read, produce, mark), admit
	// strictGoal: liveness requires the current owner to hold the fence, not only to have
	// applied everything.
	strictGoal bool
	// norec: RecoverRegressions(false): only a same-generation handover may move the era.
	norec bool
	// topics: model the topic's identity (its recreation and growth, the operator's reset
	// and acknowledgement). The faults stepTopicRecreate and stepGrow are explored only with
	// it.
	topics bool
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

func (c modelConfig) allows(k stepKind) bool {
	if (k == stepTopicRecreate || k == stepGrow) && !c.topics {
		return false
	}
	return c.allow == 0 || c.allow&(1<<k) != 0
}

func (c modelConfig) String() string {
	ob := ""
	if c.outbox {
		ob = ", outbox"
	}
	if c.topics {
		ob += ", topics"
	}
	if c.norec {
		ob += ", RecoverRegressions(false)"
	}
	return fmt.Sprintf("{protocol %s, %d processes, %d records, %d faults%s}", c.proto.name, slots, logLen, c.faults, ob)
}

func defaultModel() modelConfig {
	return modelConfig{faults: 3, maxStates: 4_000_000, maxDepth: 80, proto: realProtocol()}
}

// initial: processes 0 and 1 are members of incarnation 1 at generation 1, P assigned to
// process 0; process 2 is a spare (a static replacement, a late joiner).
func (c modelConfig) initial() mstate {
	s := mstate{inc: 1, gen: 1, owner: -1, nextMember: 1, nextWorker: 1, sPos: int8(fence.NoPosition)}
	s.member[0], s.member[1] = 1, 2
	s.nextMember = 3
	for i := range slots {
		s.inst[i] = int8(i + 1)
	}
	s.outbox, s.norec = c.outbox, c.norec
	if c.topics {
		s.tinc, s.parts = 1, 1
	}
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
	s.w[j] = wstate{id: s.nextWorker, member: s.member[j], inst: s.inst[j], epoch: s.gen, pos: int8(fence.NoPosition), norec: s.norec}
	s.w[j].decide(claimInput{Event: evStart})
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

// goal: the current owner's worker is running and has applied the whole log (and, with the
// outbox, every row was delivered and its effect admitted). With strictGoal it must also hold
// the fence: a zombie's late claim on a partition with nothing left to apply is then a
// liveness failure too (the owner notices only at its next write).
func (c modelConfig) goal(s mstate) bool {
	o := int(s.owner)
	ok := o >= 0 && s.current(o) && s.w[o].pc == pcRun && s.sPos == logLen-1 && s.w[o].pos == logLen-1
	if c.strictGoal {
		ok = ok && s.sClaimant == s.w[o].id
	}
	if c.outbox {
		ok = ok && s.delivered == s.nrows && s.inSeq == s.nrows && s.nmsgs == 0
	}
	if c.topics {
		ok = ok && s.sPosInc == s.tinc && (s.parts == 1 || s.qpc == qDone)
	}
	return ok
}

// canonical renames the member and worker ids in order of appearance (they are only ever
// compared for equality, and fresh ones are taken above every id in use), and clears the
// fields a worker no longer reads, so that states differing only there are one state.
func (s mstate) canonical() mstate {
	var wmap, mmap, imap [64]int8
	var nw, nm, ni int8
	wid := func(id int8) int8 {
		if id == 0 {
			return 0
		}
		if wmap[id] == 0 {
			nw++
			wmap[id] = nw
		}
		return wmap[id]
	}
	mid := func(id int8) int8 {
		if id == 0 {
			return 0
		}
		if mmap[id] == 0 {
			nm++
			mmap[id] = nm
		}
		return mmap[id]
	}
	iid := func(id int8) int8 {
		if id == 0 {
			return 0
		}
		if imap[id] == 0 {
			ni++
			imap[id] = ni
		}
		return imap[id]
	}
	for i := range slots {
		w := &s.w[i]
		switch w.pc {
		case pcStopped:
			*w = wstate{id: w.id, pc: pcStopped, member: w.member, revoked: w.revoked, norec: w.norec}
		case pcRun:
			// A proof is good for the recovery it precedes only: proceeding consumes it; the
			// last refusal's classification is read only after the next refusal sets it.
			w.vepoch, w.exp, w.proof = 0, tok8{}, proofNone
			w.handover, w.equal = false, false
		case pcLoad, pcClaim:
			if !w.confirm { // a confirming Load keeps the claim's position
				w.pos = 0
			}
		}
		w.id = wid(w.id)
		w.member = mid(w.member)
		w.inst = iid(w.inst)
	}
	s.sClaimant = wid(s.sClaimant)
	if s.sClaimant == 0 {
		s.sInst = 0
	}
	s.sInst = iid(s.sInst)
	for i := range slots {
		s.member[i] = mid(s.member[i])
		s.inst[i] = iid(s.inst[i])
	}
	s.nextWorker, s.nextMember = nw+1, nm+1
	return s
}

func (c modelConfig) successors(s mstate, out []transition) []transition {
	emit := func(l label, n mstate, fault bool, v string) {
		if fault {
			n.faults++
		}
		n = n.canonical()
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
	if c.topics {
		if n, what, ok := s.operator(); ok {
			emit(label{kind: stepOperator, what: what}, n, false, "")
		}
		if n, what, v, ok := s.qStep(); ok {
			emit(label{kind: stepQ, what: what}, n, false, v)
		}
	}
	if c.outbox && s.nmsgs > 0 {
		n, what, v := s.admit()
		emit(label{kind: stepAdmit, what: what}, n, false, v)
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
		if c.outbox && s.w[i].pc == pcRun {
			for _, ws := range relayStep(s, i, !c.proto.mut[mutRelayNoReclaim]) {
				emit(label{kind: stepRelay, slot: int8(i), what: ws.what}, ws.next, false, ws.violation)
			}
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
		out = append(out, transition{label: l, next: n.canonical(), fault: true})
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
			// k takes i's group.instance.id (the coordinator replaces i's member id by k's,
			// KIP-345); i, should it join again, comes back as k's former instance.
			n.inst[i], n.inst[k] = n.inst[k], n.inst[i]
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
	// Recreation and growth are explored in the same runs but not in one history: Q's worker
	// is abstract and does not model incarnations (a grown topic deleted and recreated is a
	// recreated topic, whose reset moves every partition's fence).
	if s.tinc == 1 && s.parts == 1 && c.allows(stepTopicRecreate) {
		n := s
		n.tinc++
		n.applied = [logLen]int8{} // the new incarnation's records: none applied yet
		emit(label{kind: stepTopicRecreate}, n)
	}
	// Growth after the sink has seen the topic (a topic grown before Baton first saw it is
	// adopted as it is: see DESIGN.md), once, and following the drain-then-grow procedure:
	// after P applied its log. (With a backlog, keys that moved have records on both sides of
	// the growth, and no hold can order them: see DESIGN.md.)
	if s.parts == 1 && s.tinc == 1 && s.sTopic != 0 && s.drained() && c.allows(stepGrow) {
		n := s
		n.parts, n.qpc = 2, qTopic
		emit(label{kind: stepGrow}, n)
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
	if s.tinc != 0 && s.sPos >= 0 && s.sPosInc != s.tinc {
		v = append(v, fmt.Sprintf("offsets 0..%d of topic incarnation %d skipped: the fence's position counts incarnation %d", s.sPos, s.tinc, s.sPosInc))
	}
	if s.qpc == qDone {
		v = append(v, "two writers for the key: P applies its backlog of the key after Q applied the key's later records")
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
	// The handler appends one outbox row per record (ignored when the outbox is not
	// modelled). Append checks that the fence stores exactly the token, in the same
	// transaction: after Advance it does.
	for o := first; s.outbox && o <= last && s.nrows < maxRows; o++ {
		s.rows[s.nrows] = orow{tok: w.tok}
		s.nrows++
	}
	s.sTok, s.sPos = w.tok, last // Advance keeps the claimant: the token names it
	s.sPosInc = s.tinc
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
	s.sTok, s.sClaimant, s.sInst = t, s.w[i].id, s.w[i].inst
	if s.current(i) {
		s.ownerClaimed = true
	}
	return v
}

// relayStep is the relay's flush under the worker's token, in three atomic steps: read the
// pending rows (only while the fence stores exactly the token), produce them with their
// original token and sequence, mark them delivered (a conditional write: only while the fence
// still stores the token).
func relayStep(s mstate, i int, reclaim bool) []wstep {
	w := s.w[i]
	n := s
	nw := &n.w[i]
	switch {
	case w.rto == 0:
		if s.delivered == s.nrows {
			return nil
		}
		if s.sTok != w.tok {
			if !reclaim {
				return nil // Flush fails (stale) at every attempt
			}
			nw.decide(claimInput{Event: evWriteStale, Stored: s.sTok.token()})
			return []wstep{{what: sayf("flush under %s refused (stored %s): re-claim", w.tok, s.sTok), next: n}}
		}
		nw.rfrom, nw.rto = s.delivered+1, s.nrows
		return []wstep{{what: sayf("read pending rows %d..%d under %s", nw.rfrom, nw.rto, w.tok), next: n}}
	case !w.published:
		if int(s.nmsgs)+int(w.rto-w.rfrom+1) > maxMsgs {
			return nil // the topic's bound: wait for the receiver
		}
		for q := w.rfrom; q <= w.rto; q++ {
			n.msgs[n.nmsgs] = omsg{tok: s.rows[q-1].tok, seq: q}
			n.nmsgs++
		}
		nw.published = true
		return []wstep{{what: sayf("produce rows %d..%d", w.rfrom, w.rto), next: n}}
	default:
		what := sayf("mark %d delivered under %s", w.rto, w.tok)
		switch {
		case s.sTok != w.tok:
			what += ": stale, refused"
		case s.delivered < w.rto:
			n.delivered = w.rto
		}
		nw.rfrom, nw.rto, nw.published = 0, 0, false
		return []wstep{{what: what, next: n}}
	}
}

// admit is the receiver consuming the oldest published message through its inbox, with the
// real keyed-fence rule.
func (s mstate) admit() (mstate, string, string) {
	m := s.msgs[0]
	copy(s.msgs[:], s.msgs[1:])
	s.nmsgs--
	s.msgs[s.nmsgs] = omsg{}
	v := fencecheck.CheckAdmit(s.inTok.token(), int64(s.inSeq), s.inSeq > 0, m.tok.token(), int64(m.seq))
	what := sayf("admit (%s, seq %d): %s", m.tok, m.seq, v)
	var bad string
	if v == fence.Admitted {
		if m.seq != s.inSeq+1 {
			bad = fmt.Sprintf("receiver applied seq %d after seq %d: effects lost or applied twice", m.seq, s.inSeq)
		}
		s.inTok, s.inSeq = m.tok, m.seq
	}
	return s, what, bad
}

// Q's worker states.
const (
	qNone int8 = iota
	qTopic
	qHold
	qRun
	qDone
)

var topicIDs = [...]string{"", "id1", "id2", "id3"}

// storedTopic is the identity the sink stores with the fences.
func (s *mstate) storedTopic() (fence.Topic, bool) {
	if s.sTopic == 0 {
		return fence.Topic{}, false
	}
	return fence.Topic{ID: topicIDs[s.sTopic], Partitions: int32(s.sPart)}, true
}

// topicCheck runs the real topic rule for partition p as a worker that sees the topic as it
// is now, adopting it if the sink stores nothing yet, and returns the decision's event.
func (s *mstate) topicCheck(p int32) claimEvent {
	stored, found := s.storedTopic()
	seen := fence.Topic{ID: topicIDs[s.tinc], Partitions: int32(s.parts)}
	k := modelKey
	k.Partition = p
	adopt, err := fencecheck.CheckTopic(k, stored, found, seen)
	if adopt != nil {
		s.sTopic, s.sPart = s.tinc, int8(adopt.Partitions)
	}
	switch {
	case err == nil:
		return evTopicSame
	case errors.Is(err, fence.ErrTopicRecreated):
		return evTopicRecreated
	}
	return evTopicGrown
}

// drained reports whether P's log (of the current incarnation) is applied.
func (s *mstate) drained() bool { return s.sPosInc == s.tinc && s.sPos == logLen-1 }

// operator is the operator's action, a non-fault step: a recreated topic is reset (the sink
// moves the fence to a new era with no claimant and no position, as ResetTopic does), and a
// grown topic's growth is acknowledged (the growth itself followed the drain-then-grow
// procedure).
func (s mstate) operator() (mstate, string, bool) {
	switch {
	case s.sTopic != 0 && s.sTopic != s.tinc:
		s.sTopic = s.tinc
		s.sTok, s.sClaimant, s.sInst, s.sPos, s.sPosInc = tok8of(fencecheck.ResetToken(s.sTok.token())), 0, 0, int8(fence.NoPosition), 0
		s.ownerClaimed = false
		return s, sayf("operator: topic reset to incarnation %d; fence to %s, no position", s.tinc, s.sTok), true
	case s.sTopic == s.tinc && s.sPart < s.parts:
		s.sPart = s.parts
		return s, sayf("operator: growth to %d partitions acknowledged", s.parts), true
	}
	return s, "", false
}

// qStep is Q's worker: its topic step goes through the real rule and the real claim decision
// (a claim accepted, then opTopic); opVerify stands for Q's whole claim protocol succeeding,
// and Q then applies the key's later records in one batch.
func (s mstate) qStep() (mstate, string, string, bool) {
	switch s.qpc {
	case qTopic, qHold:
		ev := s.topicCheck(1)
		cs, _ := decideClaim(claimState{Epoch: 1, Recover: true}, claimInput{Event: evClaimed})
		_, step := decideClaim(cs, claimInput{Event: ev})
		if step.Op == opHold {
			if s.qpc == qHold {
				return s, "", "", false // no change: it looks again later
			}
			s.qpc = qHold
			return s, "Q: topic grown, partition held", "", true
		}
		s.qpc = qRun
		return s, "Q: topic as stored; claimed and proven", "", true
	case qRun:
		s.qpc = qDone
		v := ""
		switch {
		case !s.drained():
			v = "two writers for the key: Q applies the key's later records while P's backlog of the key is not applied"
		case s.sPart < s.parts:
			v = "the grown topic processed before the operator acknowledged the growth"
		}
		return s, "Q: applies the key's later records", v, true
	}
	return s, "", "", false
}
