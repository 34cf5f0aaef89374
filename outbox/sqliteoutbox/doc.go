// Package sqliteoutbox is the transactional outbox of package outbox in SQLite, next to a
// sqlitefence fence table in the same database file. See package outbox for the protocol.
//
// SQLite admits one writer at a time: Append's first statement is a write that checks the
// fence, so it runs under the database write lock, and no Claim can commit between the check
// and the caller's commit. MarkDelivered is one conditional UPDATE, atomic the same way.
package sqliteoutbox
