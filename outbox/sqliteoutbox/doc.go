// Package sqliteoutbox is the transactional outbox of package outbox in SQLite, next to a
// sqlitefence fence table in the same database file. See package outbox for the protocol.
//
// # Use
//
//	box, err := sqliteoutbox.New(fences) // validates names; no I/O
//	err = box.Migrate(ctx)                    // CREATE TABLE IF NOT EXISTS, idempotent
//	err = fences.Apply(ctx, key, token, first, last, func(ctx context.Context, tx *sql.Tx) error {
//		// the caller's writes, then:
//		return box.Append(ctx, tx, key, token, outbox.Message{Topic: "events", Value: v})
//	})
//
// As in pgoutbox, New does no I/O and takes no context; [Store.Migrate] creates the tables and
// [Store.Schema] returns the same DDL for deployments that own their migrations. The default
// table names are PostgreSQL's: baton_outbox, baton_outbox_cursors and
// baton_outbox_dead_letters (the relay's fenced dead letters; Migrate adds it to an existing
// database), checked against
// the fence table of the sqlitefence store given to New.
//
// SQLite admits one writer at a time: Append's first statement is a write that checks the
// fence, so it runs under the database write lock, and no Claim can commit between the check
// and the caller's commit. MarkDelivered is one conditional UPDATE, atomic the same way;
// DeadLetter's conditional UPDATE of the cursor is its first statement, so the copy of the row
// it then writes commits under the same write lock.
// Sequences live in the cursor table, so Cleanup's deletion of delivered rows never lets one be
// reused. The store passes the outbox/outboxtest conformance suite.
package sqliteoutbox
