// Package outboxstore is for authors of outbox.Store implementations (pgoutbox, sqliteoutbox,
// or a store of your own): the checks and encodings every store applies the same way, so that
// the relay and the inbox read every store's rows alike. Users of a store never need it.
//
//   - [ValidateAppend] checks Append's arguments before any statement is sent: the source key,
//     the token, and each message (outbox.ErrNoTopic, outbox.ErrTooLarge,
//     outbox.ErrInvalidHeader, outbox.ErrInvalid). A store calls it first, so bad input writes
//     nothing.
//   - [MarshalHeaders] and [UnmarshalHeaders] are the stored form of a message's headers.
//   - [TraceContext] captures the W3C trace context of the appending transaction, which the
//     relay continues when it publishes the row.
//
// outbox/outboxtest is the conformance suite a store runs to prove the fenced-append rules.
package outboxstore
