package consumer

import (
	"errors"
	"strings"
)

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
	// errSinkUnusable ends a Run whose member cannot use its sink: a claim step (loading,
	// claiming or recovering a partition's fence) failed for longer than the bound
	// (unusableAfter, 30s) with nothing but errors no retry can fix (unusable). The error
	// wraps the sink's, and names the partition and the step.
	errSinkUnusable = errors.New("consumer: this member cannot use the sink")
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

// unusable reports whether err says that this member cannot use the sink at all, whatever it
// retries: its error tree holds a database error whose SQLSTATE (a SQLState() string method:
// pgconn.PgError, lib/pq's Error) is in class 28 (invalid authorization: a wrong password,
// a role that may not log in), 3D000 (no such database), 3F000 (no such schema), 42P01
// (no such table: the fence table was not migrated) or 42501 (insufficient privilege: a
// missing or revoked grant). Errors of a connection that failed or a database that is
// starting or shutting down (class 08, 57P0x) are not: they pass when the database is back.
func unusable(err error) bool {
	var s interface{ SQLState() string }
	if !errors.As(err, &s) {
		return false
	}
	switch code := s.SQLState(); {
	case strings.HasPrefix(code, "28"):
		return true
	case code == "3D000", code == "3F000", code == "42P01", code == "42501":
		return true
	}
	return false
}

// migrateHint is logged with an error that says a table of the sink is missing.
const migrateHint = "a table of the fence store is missing: run 'baton migrate' (or the store's Migrate) with the migration role"

// tableMissing reports whether err is the sink's own (not the handler's, nor one of the
// handler's statements that the sink sent: an error with a Statement() string method) and
// says a table is missing (SQLSTATE 42P01): the store was not migrated, or the member uses
// another schema.
func tableMissing(err error) bool {
	var h *handlerError
	var st interface{ Statement() string }
	if errors.As(err, &h) || errors.As(err, &st) {
		return false
	}
	var s interface{ SQLState() string }
	return errors.As(err, &s) && s.SQLState() == "42P01"
}
