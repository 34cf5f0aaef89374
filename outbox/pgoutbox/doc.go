// Package pgoutbox is the PostgreSQL store of Baton's fenced outbox (see package outbox): the
// outbox rows and a per-source-partition cursor, next to pgfence's fence table in the same
// database and transaction as the caller's data.
//
// Append (in the caller's pgx.Tx) and QueueAppend (in the pgx.Batch of pgfence.ApplyBatch, so
// the fence, the data and the outbox rows travel in one round trip) write the rows in one
// statement that checks the fence stores exactly the presented token, allocates gap-free
// sequences from the cursor row and inserts the rows: a zombie's append writes nothing and
// fails with *fence.StaleError. Pending and MarkDelivered are the relay's fenced reads and
// writes; Cleanup deletes delivered rows older than a given age (sequences are never reused,
// because the cursor keeps them). Table names are validated and quoted; New does no I/O, and
// Migrate creates the tables idempotently under an advisory lock (Schema returns the same DDL).
// DeadLetter is the relay's fenced give-up on the first pending row: in the same statement as
// the fence check it moves the cursor past the row and copies it, with the reason, into
// baton_outbox_dead_letters, which Cleanup never touches (DeadLetters lists them; Migrate
// creates that table in an existing database too, CREATE TABLE IF NOT EXISTS).
// The default tables are baton_outbox, baton_outbox_cursors and baton_outbox_dead_letters, checked against the fence
// table of the pgfence store given to New; sqliteoutbox uses the same names.
// The store passes the outbox/outboxtest conformance suite against a real server.
//
// Run PostgreSQL with idle_in_transaction_session_timeout set: a transaction left open holds
// the fence row (FOR SHARE) and delays a takeover until it ends.
package pgoutbox
