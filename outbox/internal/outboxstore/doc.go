// Package outboxstore is what the outbox stores (pgoutbox, sqliteoutbox) share: the checks and
// encodings every store applies the same way, so that the relay and the inbox read every
// store's rows alike.
//
//   - [ValidateAppend] checks Append's arguments before any statement is sent: the source key,
//     the token, and each message (outbox.ErrTooLarge, outbox.ErrInvalid). A store calls it
//     first, so bad input writes nothing.
//   - [MarshalHeaders] and [UnmarshalHeaders] are the stored form of a message's headers.
//   - [IdempotencyKey] is the idempotency key derived for a row that was given none.
//   - [TraceContext] captures the W3C trace context of the appending transaction, which the
//     relay continues when it publishes the row.
//
// outbox/outboxtest is the conformance suite a store runs to prove the fenced-append rules.
package outboxstore
