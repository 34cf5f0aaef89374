package consumer

import (
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
)

// validTopic reports why name is not a legal Kafka topic name: 1 to 249 characters of
// [a-zA-Z0-9._-], and not "." or ".." (Kafka's own rule, Topic.validate in the broker).
func validTopic(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %w: empty topic name", errNoTopics, errInvalidTopic)
	case name == "." || name == "..":
		return fmt.Errorf("%w: %q is not a legal topic name", errInvalidTopic, name)
	case len(name) > 249:
		return fmt.Errorf("%w: topic name of %d characters, at most 249", errInvalidTopic, len(name))
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q: a topic name has only ASCII letters, digits, '.', '_' and '-'", errInvalidTopic, name)
		}
	}
	return nil
}

// isNil reports whether v is nil or an interface holding a nil pointer, map, func, chan,
// slice or interface: a typed nil (var s *pgfence.Store; New(..., s, ...)) passes a == nil
// check and would only fail at the first claim.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Interface, reflect.Slice, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}

// probeSeed is a well-formed seed broker used only to validate options: it is never dialled.
var probeSeed = kgo.SeedBrokers("127.0.0.1:9092")

// probeGroup and probeTopic are names no user option is expected to hold.
const (
	probeGroup = "baton-validate-probe"
	probeTopic = "baton-validate-probe"
)

// checkKafka validates the user's franz-go options without creating a client, with
// kgo.ValidateOpts (the validation kgo.NewClient runs, with no goroutine, connection or
// allocation that outlives it).
//
// franz-go offers no way to read an option's value without a client (OptValue is a *Client
// method, and kgo.Opt is an interface with an unexported method), so the options Baton owns
// are found by how franz-go's own validation reacts to probe options added after the user's:
// for example kgo.ConsumePartitions is refused when a group is set, so the user set
// kgo.ConsumerGroup exactly when adding ConsumePartitions makes the options invalid. The probes
// below only rely on the rules kgo.ValidateOpts enforces; TestNewRefusesOwnedKafkaOptions pins
// each of them, so a franz-go upgrade that changes a rule fails that test instead of silently
// letting an option through. kgo.BlockRebalanceOnPoll and kgo.ConsumeTopics leave no trace in
// the validation: BlockRebalanceOnPoll is read from a client by New (see ownedInClient), and a
// ConsumeTopics among the options is replaced by New's topics.
func checkKafka(user []kgo.Opt) []error {
	with := func(first kgo.Opt, extra ...kgo.Opt) error {
		return kgo.ValidateOpts(slices.Concat([]kgo.Opt{first}, user, extra)...)
	}
	// Seed brokers: kgo defaults to localhost when none is given, so start from an empty list;
	// then tell "none given" from "given and invalid" with a valid list before and after.
	if err := with(kgo.SeedBrokers()); err != nil {
		switch other, theirs := with(kgo.SeedBrokers(), probeSeed), with(probeSeed); {
		case other != nil:
			// Something other than the seed list is invalid (whether seeds are missing
			// too cannot be told apart then).
			return []error{fmt.Errorf("%w: kafka: %w", ErrInvalidOption, other)}
		case theirs == nil:
			return []error{errNoBrokers}
		default:
			return []error{fmt.Errorf("%w: kafka seed brokers: %w", ErrInvalidOption, theirs)}
		}
	}
	ok := func(extra ...kgo.Opt) bool { return with(probeSeed, extra...) == nil }
	var (
		errs  []error
		owned = func(opt, why string) {
			errs = append(errs, fmt.Errorf("%w: %w: kgo.%s among the Kafka options: %s", ErrInvalidOption, errOwnedOption, opt, why))
		}
		probeParts = kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{probeTopic: {0: kgo.NewOffset()}})
	)
	// ShareGroup: a share group cannot be combined with a consumer group.
	share := !ok(kgo.ConsumerGroup(probeGroup), kgo.ConsumePartitions(nil))
	if share {
		owned("ShareGroup", "Baton consumes as the consumer group named in New")
	}
	// ConsumeRegex: ConsumeExcludeTopics is valid only with it.
	regex := ok(kgo.ConsumeExcludeTopics(probeTopic))
	if regex {
		owned("ConsumeRegex", "Baton consumes exactly the topics named in New")
	}
	// ConsumePartitions: refused when consuming as a group.
	if !share && !ok(kgo.ConsumerGroup(probeGroup)) {
		owned("ConsumePartitions", "partitions are assigned by the group coordinator, and each one's start is the sink's position")
	}
	// ConsumerGroup: direct partitions are refused when consuming as a group (or a share group,
	// or by regex, told apart above).
	if !share && !regex && !ok(probeParts) {
		owned("ConsumerGroup", "the group is New's group argument")
	}
	if share {
		return errs // the group probes below would trip over the share group's own rules
	}
	// Auto-commit modes: kgo refuses any two of Disable, Greedy and Marks together; the user's
	// own options are valid, so at most one of them is set, and adding each in turn tells which.
	g := []kgo.Opt{kgo.ConsumerGroup(probeGroup), kgo.ConsumePartitions(nil)}
	greedyOK, marksOK, disableOK := ok(append(g, kgo.GreedyAutoCommit())...), ok(append(g, kgo.AutoCommitMarks())...), ok(append(g, kgo.DisableAutoCommit())...)
	modes := 0
	if !greedyOK && !marksOK {
		modes++
		owned("DisableAutoCommit", "Baton commits the offsets of applied batches itself (AutoCommitMarks)")
	}
	if !greedyOK && !disableOK {
		modes++
		owned("AutoCommitMarks", "Baton sets it itself and marks only applied batches")
	}
	if !marksOK && !disableOK {
		modes++
		owned("GreedyAutoCommit", "it would commit records before they are applied")
	}
	if modes > 0 {
		// With an auto-commit mode set, every option probed below without a group is refused
		// for that mode already: the callbacks cannot be told apart until it is removed.
		return errs
	}
	// Rebalance callbacks and the commit callback are refused without a group.
	noGroup := kgo.ConsumerGroup("")
	nilAssigned, nilRevoked, nilLost := kgo.OnPartitionsAssigned(nil), kgo.OnPartitionsRevoked(nil), kgo.OnPartitionsLost(nil)
	nilCommit := kgo.AutoCommitCallback(nil)
	for _, c := range []struct {
		name, why string
		others    []kgo.Opt
	}{
		{"OnPartitionsAssigned", "Baton claims each assigned partition's fence in it", []kgo.Opt{nilRevoked, nilLost, nilCommit}},
		{"OnPartitionsRevoked", "Baton drains and commits each revoked partition in it (the rebalance barrier)", []kgo.Opt{nilAssigned, nilLost, nilCommit}},
		{"OnPartitionsLost", "Baton stops each lost partition's worker in it", []kgo.Opt{nilAssigned, nilRevoked, nilCommit}},
		{"AutoCommitCallback", "Baton commits offsets itself and logs commit failures", []kgo.Opt{nilAssigned, nilRevoked, nilLost}},
	} {
		if !ok(append([]kgo.Opt{noGroup, kgo.ConsumePartitions(nil)}, c.others...)...) {
			owned(c.name, c.why)
		}
	}
	return errs
}

// earliest is the only reset offset Baton accepts: the log start.
var earliest = kgo.NewOffset().AtStart()

// offsetName spells an offset as the franz-go call that makes it, where it is one of the
// common ones (kgo.Offset prints as its internal fields).
func offsetName(o kgo.Offset) string {
	for _, c := range []struct {
		o    kgo.Offset
		name string
	}{
		{kgo.NewOffset().AtEnd(), "kgo.NewOffset().AtEnd()"},
		{kgo.NewOffset().AtCommitted(), "kgo.NewOffset().AtCommitted()"},
		{kgo.NoResetOffset(), "kgo.NoResetOffset()"},
	} {
		if o == c.o {
			return c.name
		}
	}
	return fmt.Sprintf("an offset other than the log start: %+v", o)
}

// ownedInClient reports the owned options kgo.ValidateOpts cannot reveal: franz-go shows
// their values only through a *Client, so they are read from one that has no seed it dials, no
// group, no topics and no partitions (it starts no fetch, no metadata request and no group
// membership) and is closed at once. Options that kgo.NewClient refuses are checkKafka's.
//
//   - BlockRebalanceOnPoll: Baton polls while a rebalance waits for its partitions to drain,
//     so blocking rebalances on poll would deadlock.
//   - ConsumeResetOffset and ConsumeStartOffset other than the log start: Baton owns each
//     partition's resume point (the sink's position + 1, or 0 in a moved era), franz-go moves a
//     resume point below the log start to the reset offset and starts a partition the group
//     has no commit for at the start offset; the end (or a lookback, an exact offset, a time)
//     would skip records still in the log, which the fence accepts as a gap.
func ownedInClient(user []kgo.Opt) error {
	cl, err := kgo.NewClient(slices.Concat([]kgo.Opt{probeSeed}, kafkaDefaults(), user,
		[]kgo.Opt{kgo.ConsumerGroup(""), kgo.ConsumeTopics(), kgo.ConsumePartitions(nil)})...)
	if err != nil {
		return nil
	}
	defer cl.Close()
	var errs []error
	if v, _ := cl.OptValue(kgo.BlockRebalanceOnPoll).(bool); v {
		errs = append(errs, fmt.Errorf("%w: %w: kgo.BlockRebalanceOnPoll among the Kafka options: Baton polls while a rebalance waits for its partitions to drain, so blocking rebalances on poll would deadlock", ErrInvalidOption, errOwnedOption))
	}
	errs = append(errs, resumeNotEarliest(cl))
	return joinAll(errs)
}

// resumeNotEarliest reports a reset or start offset other than the log start (see
// ownedInClient).
func resumeNotEarliest(cl *kgo.Client) error {
	var errs []error
	if o, _ := cl.OptValue(kgo.ConsumeResetOffset).(kgo.Offset); o != earliest {
		errs = append(errs, fmt.Errorf("%w: %w: kgo.ConsumeResetOffset(%s) among the Kafka options: Baton resumes each partition at its sink's position and accepts only kgo.NewOffset().AtStart(), as a reset to anywhere else skips records still in the log", ErrInvalidOption, errOwnedOption, offsetName(o)))
	}
	if o, _ := cl.OptValue(kgo.ConsumeStartOffset).(kgo.Offset); o != earliest {
		errs = append(errs, fmt.Errorf("%w: %w: kgo.ConsumeStartOffset(%s) among the Kafka options: a partition with no position starts at the log start (kgo.NewOffset().AtStart(), the only start accepted), as a start anywhere else skips records still in the log", ErrInvalidOption, errOwnedOption, offsetName(o)))
	}
	return joinAll(errs)
}

// joinAll is errors.Join that keeps a single error unwrapped, so its message stays as it was.
func joinAll(errs []error) error {
	errs = slices.DeleteFunc(errs, func(e error) bool { return e == nil })
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}
