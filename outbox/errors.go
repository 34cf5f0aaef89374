package outbox

import "errors"

var (
	// ErrTooLarge means a [Message]'s key, value and headers together exceed the store's
	// MaxMessageBytes. Append refuses it: a row the broker would reject would block its source
	// partition's relay for ever.
	ErrTooLarge = errors.New("outbox: message too large")

	// ErrInvalid means bad input: a message without a topic or with an invalid topic name, a
	// header key that is empty, not UTF-8 or reserved (the "baton-" prefix and the W3C
	// "traceparent"/"tracestate" names belong to the relay), an invalid source key, token,
	// idempotency key, table name or option, a nil argument, or a relay client that does not
	// produce idempotently.
	ErrInvalid = errors.New("outbox: invalid argument")

	// ErrUnfenced means the fence for the source partition does not store the presented token
	// and no higher one either: the caller never claimed or advanced the fence with this token
	// in this transaction (a higher stored token is a *fence.StaleError instead).
	ErrUnfenced = errors.New("outbox: the fence does not hold this token")

	// ErrNotBaton means a record lacks the headers the relay writes (baton-token, baton-seq,
	// baton-source) or carries malformed ones: it was not published by an outbox relay.
	ErrNotBaton = errors.New("outbox: record has no valid baton headers")

	// ErrNoKey means a record reached the inbox without a key: the inbox keeps one fence per
	// record key, so keyless records cannot be deduplicated.
	ErrNoKey = errors.New("outbox: record has no key")

	// ErrFlushTimeout means a [Relay.Flush] ran out of its [FlushTimeout]: the rows not yet
	// acknowledged stay pending for the next Flush.
	ErrFlushTimeout = errors.New("outbox: flush timeout; the rest stays pending")
)
