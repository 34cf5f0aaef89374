package sqlitebulk

// Statements returns how many statements u's Exec would run for rows.
func Statements(u *Upsert, rows [][]any) int { return u.statements(rows) }

// SQL returns u's statement for n rows.
func SQL(u *Upsert, n int) string { return u.statement(n) }
