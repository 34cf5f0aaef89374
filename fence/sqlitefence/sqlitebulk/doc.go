// Package sqlitebulk is the fast write path for handlers that write to SQLite through
// sqlitefence: it turns a batch of rows into set-based upserts, INSERT INTO t VALUES (...),
// (...), ... ON CONFLICT ... DO UPDATE, of at most 1000 rows each, instead of one statement
// per record. It has the API of pgbulk, PostgreSQL's fast path, so that a handler moves
// between the two databases by changing its import and its SET clause's dialect.
//
// A handler that upserts one row per record pays, per record, a statement's bind, step and
// reset through database/sql and the driver, and the B-tree descent for its key; one
// statement of 1000 rows pays the call overhead once, and merging a key's records in Go
// (with [Merge]) writes each key once per batch. Use it inside the fenced transaction
// sqlitefence's Apply hands the handler:
//
//	up, err := sqlitebulk.NewUpsert("counters", []string{"key"},
//		[]sqlitebulk.Column{{Name: "key"}, {Name: "n"}},
//		"n = t.n + excluded.n",                // the table is aliased t
//		sqlitebulk.Merge(func(into, row []any) { into[1] = into[1].(int64) + row[1].(int64) }))
//	...
//	func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
//		rows := make([][]any, 0, len(b.Records))
//		for _, r := range b.Records {
//			rows = append(rows, []any{string(r.Key), int64(1)})
//		}
//		return up.Exec(ctx, tx, rows)
//	}
//
// # The fence in the same transaction
//
// sqlitefence's Apply runs the fence's check and advance (one conditional UPDATE of the
// fence row, a prepared statement) first in the transaction, then the handler, then commits:
// the rows Exec writes commit with the fence advance or not at all, and a refused fence rolls
// them back. PostgreSQL needs pgbulk.Sink to put the fence statement into the handler's round
// trip; SQLite runs in the process, so there is no round trip to save and the store itself is
// the fast path's sink: give the consumer the *sqlitefence.Store.
//
// # The same key twice
//
// A batch of records often holds the same key several times. Upsert handles it one of two
// ways, both keeping the records' order per key, as pgbulk does:
//
//   - with [Merge], rows of one key are folded into one row in Go before anything is sent
//     (merge(into, row) is called in record order), so each key appears once per statement:
//     the fast way, for folds that can be combined (sums, counts, last value wins);
//   - without it, the rows are split into layers, the i-th layer holding the i-th row of every
//     key, and the layers run one after the other in the same transaction, so each statement
//     sees the previous one's result: correct for any SET clause, but a key repeated k times
//     costs k statements. (SQLite would apply a repeated key's rows of one VALUES list in
//     order, but it does not document the order in which a multi-row VALUES is inserted;
//     layers depend on nothing undocumented.)
//
// # One Go value per database key
//
// Rows are one key when their keys are one value in the database, and Go cannot always tell.
// Upsert compares keys where Go can know SQLite's answer: an integer of any width as an
// int64 (int(7), int32(7) and int64(7) are one key); a []byte and a string of the same bytes
// as one value in a column with a Type (the cast reads a BLOB as text), as two without (a
// BLOB is not a TEXT). Nothing else is guessed: how the driver stores a time.Time depends on
// its connection's settings (modernc.org/sqlite's _time_format and _timezone), and whether 7
// and 7.0, "7" and 7, or "a" and "A" are one key depends on the column's affinity and
// collation. Keys must be canonical, one Go value per database key. Each statement of an
// upsert that updates (DO UPDATE) returns the key of every row it wrote, and [Upsert.Exec]
// fails, naming the table and the key as stored, if one is there twice: SQLite would have
// applied both rows in an order it does not document. The error is permanent for the
// consumer (consumer.IsPermanent): it applies the batch one record at a
// time, and dead-letters, with that reason, a record whose own rows still clash. An upsert
// of key columns only (DO NOTHING) returns nothing: of two such rows, one is inserted.
//
// # Limits
//
// A statement binds at most 32766 values (SQLite's SQLITE_MAX_VARIABLE_NUMBER default since
// 3.32, which modernc.org/sqlite keeps; r rows of c columns bind r*c): the default of 1000
// rows per statement is lowered for wide tables, and an explicit [RowsPerStatement] beyond it
// is refused by [NewUpsert].
// Statement texts are cached per row count (the full size and the remainders), so SQLite
// parses them again per call but Go builds them once.
package sqlitebulk
