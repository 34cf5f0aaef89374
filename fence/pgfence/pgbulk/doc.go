// Package pgbulk is the fast write path for handlers that write to PostgreSQL: it turns a
// batch of rows into set-based upserts, INSERT ... SELECT FROM unnest($1::type[], ...) ON
// CONFLICT ... DO UPDATE, of at most 1000 rows each, queued in one pgx.Batch: one round trip
// for the whole batch instead of one statement (or one round trip) per record.
//
// A handler that upserts one row per record spends its time in per-statement overhead: the
// database parses, plans and executes N statements. One unnest statement of 1000 rows does
// the same work in one execution, which is how the same PostgreSQL absorbs several times more
// rows per second. Use it inside the fenced transaction the consumer hands you:
//
//	up, err := pgbulk.NewUpsert("counters", []string{"key"},
//		[]pgbulk.Column{{Name: "key", Type: "text"}, {Name: "n", Type: "bigint"}},
//		"n = t.n + excluded.n",                // the table is aliased t
//		pgbulk.Merge(func(into, row []any) { into[1] = into[1].(int64) + row[1].(int64) }))
//	...
//	func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
//		rows := make([][]any, 0, len(b.Records))
//		for _, r := range b.Records {
//			rows = append(rows, []any{string(r.Key), int64(1)})
//		}
//		return up.Exec(ctx, tx, rows)
//	}
//
// # The fence in the same round trip
//
// Over pgfence's store, a consumer's batch costs begin, the fence statement, the handler's
// batch and commit: four round trips. [Sink] wraps the store so that the fence statement
// travels first in the handler's first batch (pgfence's AdvanceBatch): begin, one batch,
// commit, the same three round trips as the same writes without a fence. Give the consumer
// the Sink instead of the store:
//
//	store, err := pgfence.New(pool)
//	sink, err := pgbulk.NewSink(store, pool)
//	c, err := consumer.New(group, topics, sink, handler)  // the handler calls up.Exec(ctx, tx, rows)
//
// A Sink is a fence.Sink like the store (it passes the fencetest conformance suite); only the
// moment the fence statement is sent differs. Outside a consumer, call the Sink's Apply with
// a function that calls [Upsert.Exec]: begin, one batch holding the fence statement and the
// upserts, commit, the round trips of pgfence's ApplyBatch.
//
// # The same key twice
//
// PostgreSQL refuses an INSERT ... ON CONFLICT DO UPDATE that touches one row twice ("cannot
// affect row a second time"), and a batch of records often holds the same key several times.
// Upsert handles it one of two ways, both keeping the records' order per key:
//
//   - with [Merge], rows of one key are folded into one row in Go before anything is sent
//     (merge(into, row) is called in record order), so each key appears once: the fast way,
//     for folds that can be combined (sums, counts, last value wins);
//   - without it, the rows are split into layers, the i-th layer holding the i-th row of every
//     key, and the layers run one after the other in the same transaction, so each statement
//     sees the previous one's result: correct for any SET clause, but a key repeated k times
//     costs k statements.
//
// # One Go value per database key
//
// Rows are one key when their keys are one value in the database, and Go cannot always tell.
// Upsert compares keys as PostgreSQL stores them where Go can know it: an integer of any
// width as an int64 (int(7), int32(7) and int64(7) are one key), a []byte and a string of
// the same bytes as one value, a time.Time as pgx encodes it for the key column's declared
// type (timestamptz: the instant, to the microsecond, whatever its zone; timestamp: the wall
// clock, its zone dropped; date: the day). Nothing else is guessed: equality under a
// collation (citext, a nondeterministic collation), of numeric text ("1" and "1.0") or of a
// float and an integer is the database's. Keys must be canonical, one Go value per database
// key (a citext key lower-cased, numbers formatted one way): two keys equal only in the
// database reach one statement, which PostgreSQL refuses ("ON CONFLICT DO UPDATE command
// cannot affect row a second time", SQLSTATE 21000). [Upsert.Exec] then fails with an error
// that names the table and the likely keys, wraps PostgreSQL's, and is permanent for the
// consumer (consumer.IsPermanent): it applies the batch one record at a time, and
// dead-letters, with that reason, a record whose own rows still clash, instead of retrying
// the batch for ever.
//
// Values of a column are sent as one typed array when they all have one Go type: string,
// []byte, int64, int32, int, float64, bool or time.Time; otherwise as []any, which pgx
// encodes element by element.
package pgbulk
