// Package occsql builds the statements of the SQL stores' optimistic writes
// (fence.Versioned): the names are validated and quoted once (internal/sqlident), the
// arguments are checked before any statement runs, and a refusal is classified the same way
// by every store. Placeholders differ between PostgreSQL ($1) and SQLite (?), so the SQL is
// built with the store's placeholder function.
package occsql
