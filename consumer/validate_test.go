package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/memfence"
)

func pgFactory(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
	return nil, nil
}

// A typed nil sink passes a == nil check; New must still refuse it.
func TestNewRefusesTypedNilSink(t *testing.T) {
	var s *pgfence.Store
	_, err := consumer.New("g", []string{"t"}, fence.Sink[pgx.Tx](s), nil, consumer.PerPartition(pgFactory), consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1")))
	if !errors.Is(err, consumer.ErrNilSink) {
		t.Fatalf("typed nil sink: %v, want ErrNilSink", err)
	}
}

func TestNewRefusesInvalidTopicNames(t *testing.T) {
	s, f := newStore(t), newFolder().factory
	brokers := consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1"))
	for _, name := range []string{"bad topic!", strings.Repeat("x", 250), ".", "..", "a/b", "ü"} {
		if _, err := consumer.New("g", []string{name}, s, nil, consumer.PerPartition(f), brokers); !errors.Is(err, consumer.ErrInvalidTopic) {
			t.Errorf("topic %.20q: %v, want ErrInvalidTopic", name, err)
		}
		if _, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), brokers, consumer.DeadLetterTopic(name)); !errors.Is(err, consumer.ErrInvalidOption) {
			t.Errorf("dead-letter topic %.20q: %v, want ErrInvalidOption", name, err)
		}
	}
	for _, name := range []string{strings.Repeat("x", 249), "orders.v2_eu-1", "..."} {
		if _, err := consumer.New("g", []string{name}, s, nil, consumer.PerPartition(f), brokers); err != nil {
			t.Errorf("topic %.20q: %v, want it accepted", name, err)
		}
	}
}

// Every problem is reported at once, each matching its sentinel. (Among the Kafka options,
// missing seed brokers are told apart only when the other Kafka options are valid.)
func TestNewReportsEverything(t *testing.T) {
	_, err := consumer.New[*memfence.Tx]("", []string{"ok", "bad topic!"}, nil, nil,
		nil, consumer.MaxInflight(0), consumer.Logger(nil))
	for _, want := range []error{consumer.ErrNoGroup, consumer.ErrInvalidTopic, consumer.ErrNilSink, consumer.ErrNilHandler,
		consumer.ErrNoBrokers, consumer.ErrInvalidOption} {
		if !errors.Is(err, want) {
			t.Errorf("%v\ndoes not match %v", err, want)
		}
	}
	for _, want := range []string{"option 0 is nil", "MaxInflight 0", "nil logger"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not mention %q", err, want)
		}
	}
}

func TestNewKafkaOptions(t *testing.T) {
	s, f := newStore(t), newFolder().factory
	seeds := kgo.SeedBrokers("127.0.0.1:1")
	newWith := func(opts ...kgo.Opt) error {
		_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), consumer.Kafka(opts...))
		return err
	}
	if err := newWith(); !errors.Is(err, consumer.ErrNoBrokers) {
		t.Errorf("no seed brokers: %v, want ErrNoBrokers", err)
	}
	if err := newWith(kgo.SeedBrokers("127.0.0.1:notaport")); !errors.Is(err, consumer.ErrInvalidOption) || errors.Is(err, consumer.ErrNoBrokers) {
		t.Errorf("invalid seed broker: %v, want ErrInvalidOption, not ErrNoBrokers", err)
	}
	if err := newWith(seeds, kgo.SessionTimeout(0)); !errors.Is(err, consumer.ErrInvalidOption) || errors.Is(err, consumer.ErrOwnedOption) {
		t.Errorf("invalid session timeout: %v, want ErrInvalidOption", err)
	}
	// The options a user legitimately passes through.
	if err := newWith(seeds, kgo.ClientID("me"), kgo.SessionTimeout(6e9), kgo.FetchMaxBytes(1<<20), kgo.InstanceID("m1"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.Balancers(kgo.RoundRobinBalancer()), kgo.ConsumeTopics("ignored")); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

func TestNewRefusesOwnedKafkaOptions(t *testing.T) {
	s, f := newStore(t), newFolder().factory
	seeds := kgo.SeedBrokers("127.0.0.1:1")
	cb := func(context.Context, *kgo.Client, map[string][]int32) {}
	parts := map[string]map[int32]kgo.Offset{"x": {0: kgo.NewOffset()}}
	commitCb := func(*kgo.Client, *kmsg.OffsetCommitRequest, *kmsg.OffsetCommitResponse, error) {}
	cases := []struct {
		name string
		opts []kgo.Opt
	}{
		{"ConsumerGroup", []kgo.Opt{kgo.ConsumerGroup("other")}},
		{"ShareGroup", []kgo.Opt{kgo.ShareGroup("other")}},
		{"ConsumeRegex", []kgo.Opt{kgo.ConsumeRegex(), kgo.ConsumeTopics("t.*")}},
		{"ConsumePartitions", []kgo.Opt{kgo.ConsumePartitions(parts)}},
		{"OnPartitionsAssigned", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.OnPartitionsAssigned(cb)}},
		{"OnPartitionsRevoked", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.OnPartitionsRevoked(cb)}},
		{"OnPartitionsLost", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.OnPartitionsLost(cb)}},
		{"DisableAutoCommit", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.DisableAutoCommit()}},
		{"AutoCommitMarks", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.AutoCommitMarks()}},
		{"GreedyAutoCommit", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.GreedyAutoCommit()}},
		{"AutoCommitCallback", []kgo.Opt{kgo.ConsumerGroup("g"), kgo.AutoCommitCallback(commitCb)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), consumer.Kafka(append([]kgo.Opt{seeds}, c.opts...)...))
			if !errors.Is(err, consumer.ErrOwnedOption) || !errors.Is(err, consumer.ErrInvalidOption) {
				t.Fatalf("%v, want ErrOwnedOption and ErrInvalidOption", err)
			}
			if !strings.Contains(err.Error(), "kgo."+c.name+" ") {
				t.Fatalf("%q does not name kgo.%s", err, c.name)
			}
			// Only the option given is named (ConsumerGroup comes along in most cases).
			for _, other := range cases {
				if other.name != c.name && other.name != "ConsumerGroup" && strings.Contains(err.Error(), "kgo."+other.name+" ") {
					t.Errorf("%q also names kgo.%s", err, other.name)
				}
			}
		})
	}
	// Several at once are all named.
	_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), consumer.Kafka(seeds, kgo.ConsumerGroup("g"),
		kgo.OnPartitionsRevoked(cb), kgo.OnPartitionsLost(cb), kgo.AutoCommitCallback(commitCb)))
	for _, name := range []string{"ConsumerGroup", "OnPartitionsRevoked", "OnPartitionsLost", "AutoCommitCallback"} {
		if err == nil || !strings.Contains(err.Error(), "kgo."+name+" ") {
			t.Errorf("%v\ndoes not name kgo.%s", err, name)
		}
	}
}

// BlockRebalanceOnPoll leaves no trace in franz-go's validation: New reads it from a client
// that connects nowhere and refuses it, with the other problems.
func TestNewRefusesBlockRebalanceOnPoll(t *testing.T) {
	_, err := consumer.New("g", []string{"t"}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.BlockRebalanceOnPoll()), consumer.MaxInflight(0))
	if !errors.Is(err, consumer.ErrOwnedOption) || !strings.Contains(err.Error(), "kgo.BlockRebalanceOnPoll") || !strings.Contains(err.Error(), "MaxInflight 0") {
		t.Fatalf("New = %v, want ErrOwnedOption naming kgo.BlockRebalanceOnPoll, and MaxInflight reported with it", err)
	}
}

// The handler and PerPartition are one choice: New refuses both, neither, and a factory or a
// dead-letter function of another transaction type than the sink's, all at once.
func TestNewHandlerChoice(t *testing.T) {
	s := newStore(t)
	brokers := consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1"))
	h := func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }
	f := func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) { return h, nil }
	if _, err := consumer.New("g", []string{"t"}, s, h, brokers); err != nil {
		t.Errorf("a handler: %v", err)
	}
	if _, err := consumer.New("g", []string{"t"}, s, nil, brokers, consumer.PerPartition(f)); err != nil {
		t.Errorf("PerPartition: %v", err)
	}
	if _, err := consumer.New("g", []string{"t"}, s, h, brokers, consumer.PerPartition(f)); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Errorf("both: %v, want ErrInvalidOption", err)
	}
	if _, err := consumer.New("g", []string{"t"}, s, nil, brokers); !errors.Is(err, consumer.ErrNilHandler) {
		t.Errorf("neither: %v, want ErrNilHandler", err)
	}
	other := func(context.Context, fence.Key, fence.Token) (consumer.Handler[int], error) { return nil, nil }
	wrongDL := func(context.Context, string, *consumer.Batch, *kgo.Record) error { return nil }
	_, err := consumer.New("g", []string{"t"}, s, nil, brokers, consumer.PerPartition(other),
		consumer.FencedDeadLetters(wrongDL), consumer.MaxInflight(0))
	for _, want := range []string{"PerPartition builds handlers of int", "FencedDeadLetters takes string", "MaxInflight 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not say %q", err, want)
		}
	}
	if !errors.Is(err, consumer.ErrInvalidOption) {
		t.Errorf("%v: want ErrInvalidOption", err)
	}
}

// Two dead-letter functions are two answers to one question, like two PerPartition factories
// (outboxconsumer.DeadLetters is one): New refuses the second, with the other errors, rather
// than keep whichever came last.
func TestNewRefusesTwoDeadLetterFunctions(t *testing.T) {
	h := func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }
	dl := func(context.Context, *memfence.Tx, *consumer.Batch, *kgo.Record) error { return nil }
	_, err := consumer.New("g", []string{"t"}, newStore(t), h, consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1")),
		consumer.FencedDeadLetters(dl), consumer.FencedDeadLetters(dl), consumer.MaxInflight(0))
	if !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("New with FencedDeadLetters twice = %v, want ErrInvalidOption", err)
	}
	for _, want := range []string{"FencedDeadLetters given twice", "MaxInflight 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not say %q", err, want)
		}
	}
}

// Baton owns each partition's resume point, and franz-go moves one that fell below the log
// start to kgo.ConsumeResetOffset. Accepted at the end, a new owner resuming at its position + 1
// below the log start would be moved to the end, the fence would take the gap (first >
// stored), and the records still in the log would never be applied. New refuses every reset
// other than the log start, names it, and still reports the other problems with it.
func TestNewRefusesAResetOffsetOtherThanEarliest(t *testing.T) {
	s, f := newStore(t), newFolder().factory
	seeds := kgo.SeedBrokers("127.0.0.1:1")
	newWith := func(opts ...consumer.Option) error {
		_, err := consumer.New("g", []string{"t"}, s, nil, append([]consumer.Option{consumer.PerPartition(f)}, opts...)...)
		return err
	}
	for name, o := range map[string]kgo.Offset{
		"end":      kgo.NewOffset().AtEnd(),
		"none":     kgo.NoResetOffset(),
		"rewind":   kgo.RewindOffset(time.Minute),
		"lookback": kgo.LookbackOffset(time.Hour),
		"exact":    kgo.NewOffset().At(3),
		"relative": kgo.NewOffset().AtStart().Relative(2),
		"time":     kgo.NewOffset().AfterMilli(1),
	} {
		err := newWith(consumer.Kafka(seeds, kgo.ConsumeResetOffset(o)))
		if !errors.Is(err, consumer.ErrInvalidOption) || err == nil || !strings.Contains(err.Error(), "kgo.ConsumeResetOffset") {
			t.Errorf("reset to the %s: %v, want ErrInvalidOption naming kgo.ConsumeResetOffset: accepted, it would skip records still in the log", name, err)
		}
	}
	// The start offset (a partition the group has no commit for) is the same decision: a
	// fence with no position resumes where franz-go starts, and a start at the end skips
	// what the log holds.
	for name, o := range map[string]kgo.Offset{"end": kgo.NewOffset().AtEnd(), "exact": kgo.NewOffset().At(3),
		"lookback": kgo.LookbackOffset(time.Hour)} {
		err := newWith(consumer.Kafka(seeds, kgo.ConsumeStartOffset(o)))
		if !errors.Is(err, consumer.ErrInvalidOption) || !strings.Contains(err.Error(), "kgo.ConsumeStartOffset") {
			t.Errorf("start at the %s: %v, want ErrInvalidOption naming kgo.ConsumeStartOffset: accepted, it would skip records still in the log", name, err)
		}
	}
	if err := newWith(consumer.Kafka(seeds, kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))); err == nil || !strings.Contains(err.Error(), "kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd())") {
		t.Errorf("reset to the end: %v, want the option spelled as the user wrote it", err)
	}
	if err := newWith(consumer.Kafka(seeds, kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()))); err != nil {
		t.Errorf("start at the log start: %v, want it accepted", err)
	}
	if err := newWith(consumer.Kafka(seeds, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))); err != nil {
		t.Errorf("reset to the log start: %v, want it accepted", err)
	}
	if err := newWith(consumer.Kafka(seeds)); err != nil {
		t.Errorf("no reset offset: %v, want it accepted (Baton's default is the log start)", err)
	}
	err := newWith(consumer.Kafka(seeds, kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd())), consumer.MaxInflight(0))
	if err == nil || !strings.Contains(err.Error(), "kgo.ConsumeResetOffset") || !strings.Contains(err.Error(), "MaxInflight 0") {
		t.Errorf("%v: want both the reset offset and MaxInflight reported", err)
	}
}

// AdmitDeadLetters is checked by New like FencedDeadLetters: nil, another transaction type than
// the sink's, or given twice, each named, with the other errors.
func TestNewChecksAdmitDeadLetters(t *testing.T) {
	h := func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }
	admit := func(context.Context, *memfence.Tx, *kgo.Record) (fence.Verdict, error) { return fence.Admitted, nil }
	wrong := func(context.Context, string, *kgo.Record) (fence.Verdict, error) { return fence.Admitted, nil }
	brokers := consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1"))
	for name, c := range map[string]struct {
		opts []consumer.Option
		want string
	}{
		"nil":   {[]consumer.Option{consumer.AdmitDeadLetters[*memfence.Tx](nil)}, "nil AdmitDeadLetters function"},
		"type":  {[]consumer.Option{consumer.AdmitDeadLetters(wrong)}, "AdmitDeadLetters takes string"},
		"twice": {[]consumer.Option{consumer.AdmitDeadLetters(admit), consumer.AdmitDeadLetters(admit)}, "AdmitDeadLetters given twice"},
	} {
		_, err := consumer.New("g", []string{"t"}, newStore(t), h, append(c.opts, brokers, consumer.MaxInflight(0))...)
		if !errors.Is(err, consumer.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "MaxInflight 0") {
			t.Errorf("%s: %v, want ErrInvalidOption saying %q and MaxInflight 0", name, err, c.want)
		}
	}
	if _, err := consumer.New("g", []string{"t"}, newStore(t), h, brokers, consumer.AdmitDeadLetters(admit)); err != nil {
		t.Errorf("AdmitDeadLetters: %v", err)
	}
}
