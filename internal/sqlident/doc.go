// Package sqlident validates and quotes the SQL identifiers (table names) that stores take as
// options. Table names cannot be bound as query parameters, so they are spliced into SQL text;
// this package is the single place that decides which names are allowed and how they are
// quoted, so that no store ever splices a name it has not validated.
//
// The accepted form is deliberately narrow: one or two dot-separated parts, each matching
// [A-Za-z_][A-Za-z0-9_]* and at most [MaxLen] bytes (PostgreSQL's NAMEDATALEN-1; longer names
// would be silently truncated by the server and could then collide). Names are always quoted
// when spliced, so they are case-sensitive and may be reserved words.
package sqlident
