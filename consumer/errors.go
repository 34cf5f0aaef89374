package consumer

import "errors"

var (
	// errNoGroup means New was given an empty consumer group name.
	errNoGroup = errors.New("consumer: empty group")
	// errNoTopics means New was given no topics, or an empty topic name.
	errNoTopics = errors.New("consumer: no topics")
	// errInvalidTopic means a topic name Kafka refuses: empty, longer than 249 characters,
	// "." or "..", or with a character outside [a-zA-Z0-9._-].
	errInvalidTopic = errors.New("consumer: invalid topic name")
	// errNilSink means New was given a nil sink, or a typed nil (a nil pointer, map, func or
	// chan in the interface).
	errNilSink = errors.New("consumer: nil sink")
	// errNilHandler means New was given neither a handler nor [PerPartition].
	errNilHandler = errors.New("consumer: nil handler")
	// errNoBrokers means the Kafka options passed with [Kafka] name no seed brokers.
	errNoBrokers = errors.New("consumer: no seed brokers")
	// ErrInvalidOption means an option was given an invalid value (a non-positive bound,
	// a nil logger or provider, an invalid kgo option, a kgo option Baton owns).
	ErrInvalidOption = errors.New("consumer: invalid option")
	// errOwnedOption means the [Kafka] options hold one Baton sets itself (ConsumerGroup,
	// ConsumeTopics' alternatives, the rebalance callbacks, the auto-commit modes and callback,
	// BlockRebalanceOnPoll); the error names it and says why. It comes with ErrInvalidOption.
	errOwnedOption = errors.New("consumer: kafka option owned by Baton")
	// ErrNotJoined means Run ended (its ctx was done) before this member ever joined the
	// group: the cluster was unreachable, authentication failed or the group could not be
	// joined. The error carries the last cause franz-go reported.
	ErrNotJoined = errors.New("consumer: never joined the group")
	// errPermanent marks a handler error that retrying cannot fix (a poison record). Wrap
	// errors with [Permanent]; test with errors.Is.
	errPermanent = errors.New("consumer: permanent error")
)

// Permanent marks err as permanent: the batch is rolled back, the records before the failing
// one are applied, the failing record is dead-lettered and the partition goes on. Wrap the
// result in a *partition.RecordError (or use [Batch.Fail]) to name the failing record;
// otherwise the consumer finds it by applying the batch one record at a time. An error whose
// tree holds an error with a method Permanent() bool that returns true is permanent too:
// that is how packages the consumer builds on (pgbulk, sqlitebulk) mark theirs.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() []error {
	return []error{errPermanent, e.err}
}

// IsPermanent reports whether err was marked with [Permanent], or holds an error whose
// Permanent method reports true.
func IsPermanent(err error) bool {
	if errors.Is(err, errPermanent) {
		return true
	}
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}
