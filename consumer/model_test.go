package consumer

// The model check: an exhaustive, bounded, breadth-first exploration of every interleaving
// of an abstract model of Baton's ownership protocol: model_engine_test.go is the explorer,
// model_system_test.go the model (group, coordinator, sink, outbox, faults, invariants),
// model_proto_test.go the worker's steps and model_mutants_test.go the broken variants the
// model must catch and the narrow explorations that catch a broken claim rule fast. The model calls the real rules: the fence rules of internal/fencecheck for
// every sink step, and the consumer's claim decision (decideClaim) for every worker step, so
// a change to either is model-checked.
//
//	go test -v -run 'TestModel' ./consumer                       # the CI bound, with state counts and traces
//	BATON_MODEL_FAULTS=4 BATON_MODEL_OUTBOX_FAULTS=2 go test ...  # deeper
//	BATON_MODEL_MAX_STATES=50000000 BATON_MODEL_MAX_DEPTH=200 ...  # the bounds of a deeper run
//
// Every exploration is bounded in states and depth (modelConfig): a protocol whose states
// never repeat (a token that grows at every claim) fails with the bound named, in seconds,
// instead of exploring until the machine runs out of memory.

import (
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// modelBound returns the fault budget of the CI run, or the one env names for a deeper local
// run.
func modelBound(t *testing.T, env string, def int) int {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 8 {
		t.Fatalf("%s=%q: want an integer in [0, 8]", env, v)
	}
	return n
}

// TestModel explores the protocol as it is and requires every invariant to hold in every
// reachable state, and the bounded liveness property from every reachable state.
func TestModel(t *testing.T) {
	if testing.Short() {
		t.Skip("model check: skipped with -short")
	}
	for _, outbox := range []bool{false, true} {
		cfg := defaultModel()
		cfg.outbox = outbox
		cfg.faults = modelBound(t, "BATON_MODEL_FAULTS", 3)
		if outbox { // the outbox multiplies the states by ~40 at the same bound
			cfg.faults = modelBound(t, "BATON_MODEL_OUTBOX_FAULTS", 1)
		}
		t.Run(map[bool]string{false: "protocol", true: "outbox"}[outbox], func(t *testing.T) { checkModel(t, cfg) })
	}
}

// modelLimits applies the bounds a deeper local run sets (BATON_MODEL_MAX_STATES,
// BATON_MODEL_MAX_DEPTH) to cfg.
func modelLimits(t *testing.T, cfg modelConfig) modelConfig {
	t.Helper()
	for env, v := range map[string]*int{"BATON_MODEL_MAX_STATES": &cfg.maxStates, "BATON_MODEL_MAX_DEPTH": &cfg.maxDepth} {
		s := os.Getenv(env)
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive integer", env, s)
		}
		*v = n
	}
	return cfg
}

// targetedStates bounds a narrow exploration (modelTargets, modelMutants): each stays below
// 130,000 states.
const targetedStates = 500_000

func checkModel(t *testing.T, cfg modelConfig) {
	t.Helper()
	cfg = modelLimits(t, cfg)
	start := time.Now()
	res := explore(cfg)
	t.Logf("model %s: %d states, %d transitions, depth %d, %v", cfg, res.states, res.edges, res.depth, time.Since(start).Round(time.Millisecond))
	if res.violation != nil {
		t.Fatalf("invariant violated: %s\n%s", res.violation.what, res.trace(res.violation.state))
	}
	if res.stuck >= 0 {
		t.Fatalf("liveness violated: from the last state no fault-free path lets the current owner apply the log\n%s%s", res.trace(res.stuck), res.continuation(res.stuck, 12))
	}
}

// modelCase is one targeted exploration: the protocol (the real one unless a model mutant
// is named), the faults it allows, and for a model mutant the counterexample it must produce
// (a regular expression over an invariant's text, or "liveness").
type modelCase struct {
	name   string
	proto  protocol
	allow  faultSet
	want   string
	topics bool // model the topic's identity
	norec  bool // RecoverRegressions(false)
}

// TestModelFindsRevertedFixes runs the model against each of its own mutants and requires the
// counterexample; the traces are logged (go test -v -run TestModelFindsRevertedFixes).
func TestModelFindsRevertedFixes(t *testing.T) {
	if testing.Short() {
		t.Skip("model check: skipped with -short")
	}
	for _, f := range modelMutants() {
		t.Run(f.name, func(t *testing.T) {
			cfg := defaultModel()
			cfg.proto, cfg.allow, cfg.topics, cfg.norec = f.proto, f.allow, f.topics, f.norec
			cfg.maxStates = targetedStates
			start := time.Now()
			res := explore(cfg)
			var got, trace string
			switch {
			case res.violation != nil:
				got, trace = res.violation.what, res.trace(res.violation.state)
			case res.stuck >= 0:
				got, trace = "liveness: from the last state no fault-free path lets the current owner apply the log", res.trace(res.stuck)+res.continuation(res.stuck, 12)
			default:
				t.Fatalf("model %s: %d states, no counterexample; want %q", cfg, res.states, f.want)
			}
			t.Logf("model %s: %d states, %v: %s\n%s", cfg, res.states, time.Since(start).Round(time.Millisecond), got, trace)
			if !regexp.MustCompile(f.want).MatchString(got) {
				t.Fatalf("counterexample %q, want one matching %q", got, f.want)
			}
		})
	}
}

// TestModelTargetedFaults explores the protocol as it is under each narrow fault set of
// modelTargets and requires every invariant and the liveness property to hold.
func TestModelTargetedFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("model check: skipped with -short")
	}
	for _, f := range modelTargets() {
		t.Run(f.name, func(t *testing.T) {
			cfg := defaultModel()
			cfg.allow, cfg.topics, cfg.norec = f.allow, f.topics, f.norec
			cfg.maxStates = targetedStates
			checkModel(t, cfg)
		})
	}
}

// TestModelTopics explores the protocol with the topic's identity modelled: the topic deleted and recreated (a new ID and a new log, the fence's position
// counting the old one's offsets), the topic grown after P drained (the drain-then-grow
// procedure; the key moves from P to a new partition Q), with rebalances, session expiries,
// coordinator loads and lost replies, and an operator who resets a recreated topic and
// acknowledges growth. Every invariant must hold (no offset skipped or applied twice, one
// writer per key, nothing of a grown topic applied before the acknowledgement), and the
// current owner (and Q's) must eventually apply everything of the current incarnation.
func TestModelTopics(t *testing.T) {
	if testing.Short() {
		t.Skip("model check: skipped with -short")
	}
	cfg := defaultModel()
	cfg.topics = true
	cfg.faults = modelBound(t, "BATON_MODEL_TOPIC_FAULTS", 3)
	cfg.allow = faultsOf(stepTopicRecreate, stepGrow, stepRebalance, stepExpire, stepWorkerReplyLost, stepLoadStart)
	checkModel(t, cfg)
}

// TestModelRelayGap: an idle owner whose relay is refused re-claims. A relay Flush refused as
// stale was only logged and retried at the next idle tick, so an owner with nothing left to
// apply did not notice that a zombie's late claim (a member of an old group incarnation at a
// higher generation) took the fence, and its outbox rows waited for the partition's next
// record. The runtime now re-runs the claim decision on such a refusal (worker.afterCommit;
// TestIdleOwnerReclaimsWhenItsRelayIsRefused): with it the liveness property holds, and the
// old behaviour (mutRelayNoReclaim) must show the gap.
func TestModelRelayGap(t *testing.T) {
	if testing.Short() {
		t.Skip("model check: skipped with -short")
	}
	cfg := defaultModel()
	cfg.outbox, cfg.faults, cfg.allow = true, 2, faultsOf(stepRebalance, stepRecreate)
	checkModel(t, cfg)
	cfg.proto = mutantProtocol(mutRelayNoReclaim)
	res := explore(cfg)
	if res.violation != nil || res.stuck < 0 {
		t.Fatalf("model %s: %d states, want the liveness gap of a refusal only logged", cfg, res.states)
	}
	t.Logf("model %s: %d states: the gap the re-claim closes:\n%s%s", cfg, res.states, res.trace(res.stuck), res.continuation(res.stuck, 4))
}

// TestModelStaticHandover explores static members replaced without a rebalance (the new
// process's worker presents the very token its predecessor, now a zombie, claimed) together
// with rebalances, expiries, joins, coordinator loads and lost replies, under
// RecoverRegressions(false): a same-generation handover is not a regression, so the new owner
// must still get the partition (liveness), and only through the coordinator's proof and a new
// era (every invariant: no era raised by a non-current or unproven worker, one writer). The
// recreated group, a genuine regression that RecoverRegressions(false) leaves to an operator,
// is not among the faults. Reverting the classification (HandoverIsRegression) or the proof
// (HandoverUnproven) is caught by TestModelFindsRevertedFixes.
func TestModelStaticHandover(t *testing.T) {
	if testing.Short() {
		t.Skip("model check: skipped with -short")
	}
	cfg := defaultModel()
	cfg.norec = true
	cfg.faults = modelBound(t, "BATON_MODEL_STATIC_FAULTS", 3)
	cfg.allow = faultsOf(stepStaticReplace, stepRebalance, stepExpire, stepJoin, stepLoadStart, stepWorkerReplyLost)
	checkModel(t, cfg)
}
