// Package pgmigrate applies an idempotent DDL script to PostgreSQL safely under concurrency:
// the script runs in one transaction holding a transaction-scoped advisory lock keyed by a
// name, because concurrent CREATE TABLE IF NOT EXISTS of the same table can otherwise fail on
// the catalog's unique indexes. The fence and outbox stores share it.
package pgmigrate
