package pgbulk

import "github.com/jackc/pgx/v5"

// SQL returns u's statement, with one array parameter per column.
func SQL(u *Upsert) string { return u.sql }

// Queue queues the statements u's Exec would send for rows to b.
func Queue(u *Upsert, b *pgx.Batch, rows [][]any) error { return u.queue(b, rows) }
