package status

import (
	"errors"
	"fmt"
)

var (
	// ErrUnreachable means a source (the brokers, the database) could not be reached; the error
	// names the source and the address tried.
	ErrUnreachable = errors.New("status: source unreachable")
	// ErrNotFound means what was asked for does not exist: a group with neither members,
	// committed offsets nor fence rows, a topic the brokers do not know, a store with no fence
	// table or no fence rows for the group.
	ErrNotFound = errors.New("status: not found")
	// ErrLiveOwner means recover was refused because a live member of the group owns the
	// partition; -force overrides it.
	ErrLiveOwner = errors.New("status: a live member owns the partition")
	// ErrUsage means the request itself is wrong (no reason for a recovery, an unknown
	// partitioner, a malformed store address); nothing was tried.
	ErrUsage = errors.New("status: bad request")
)

// statusError is an error of one of the kinds above whose message is only its sentence: an
// operator reads "Kafka at ... did not answer", not the sentinel's text.
type statusError struct {
	kind error
	msg  string
}

func (e *statusError) Error() string { return e.msg }
func (e *statusError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &statusError{kind: kind, msg: fmt.Sprintf(format, args...)}
}
