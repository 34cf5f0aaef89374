package sqlitebulk

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/batonhq/baton/internal/bulk"
	"github.com/batonhq/baton/internal/sqlident"
)

// defaultRowsPerStatement is how many rows one statement carries unless [RowsPerStatement]
// says otherwise (and fewer when the columns are many: see maxVariables).
const defaultRowsPerStatement = 1000

// maxVariables is the most bound parameters one statement may carry: SQLite's
// SQLITE_MAX_VARIABLE_NUMBER default since 3.32 (modernc.org/sqlite keeps it). A statement
// of r rows over c columns binds r*c.
const maxVariables = 32766

// Column is one column written by an [Upsert]: its name and, optionally, a type the bound
// value is cast to (CAST(? AS type), as in "INTEGER", "REAL", "TEXT"); empty: the value as
// bound, under the column's affinity.
type Column struct {
	Name string
	Type string
}

// Option configures an [Upsert].
type Option func(*config) error

type config = bulk.Config

// Merge folds rows with the same key into one before they are sent: merge(into, row) is
// called, in order, for every row whose key an earlier row of the same call already had, with
// into that earlier (already merged) row. It must update into in place; the key columns must
// stay as they are. Without Merge, repeated keys are written in layers (see the package doc).
func Merge(merge func(into, row []any)) Option { return bulk.MergeOption("sqlitebulk", merge) }

// RowsPerStatement bounds the rows of one statement (default 1000, lowered so that a
// statement binds at most 32766 values, SQLite's default limit: 819 rows of 40 columns).
func RowsPerStatement(n int) Option { return bulk.RowsOption("sqlitebulk", n) }

// Upsert writes rows into one table with multi-row INSERT ... ON CONFLICT statements. It is
// immutable apart from a cache of statement texts, and safe for concurrent use.
type Upsert struct {
	cols   []Column
	spec   bulk.Spec
	head   string // INSERT INTO ... VALUES
	tail   string // ON CONFLICT ... [RETURNING the key]
	tuple  string // (?, ?, ...)
	table  string
	key    []string
	keys   bool // the statement returns the key of each row it wrote
	mu     sync.Mutex
	byRows map[int]string // statement text by row count
	db     *sql.DB        // set by Prepare
	stmts  map[int]*sql.Stmt
}

// NewUpsert returns the upsert of cols into table with the conflict target key (column
// names, all among cols; a unique index must cover them). set is the DO UPDATE SET clause,
// in which the table is aliased t and the new row is excluded, as in "n = t.n + excluded.n";
// an empty set means every non-key column takes the new row's value (DO NOTHING when there is
// none). table may be schema-qualified. NewUpsert validates everything and reports every
// problem at once; it does no I/O.
func NewUpsert(table string, key []string, cols []Column, set string, opts ...Option) (*Upsert, error) {
	u := &Upsert{cols: slices.Clone(cols), byRows: map[int]string{}, table: table, key: slices.Clone(key)}
	var errs []error
	u.spec, errs = bulk.New("sqlitebulk", table, key, bulk.Columns(cols), true, defaultRowsPerStatement, keyNorm, opts)
	cfg := &u.spec.Cfg
	if len(cols) > 0 && cfg.Rows*len(cols) > maxVariables {
		if cfg.RowsSet {
			errs = append(errs, fmt.Errorf("sqlitebulk: RowsPerStatement(%d) over %d columns binds %d values, more than %d",
				cfg.Rows, len(cols), cfg.Rows*len(cols), maxVariables))
		} else {
			cfg.Rows = maxVariables / len(cols)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	u.build(table, key, set)
	return u, nil
}

func (u *Upsert) build(table string, key []string, set string) {
	marks := make([]string, len(u.cols))
	for i, c := range u.cols {
		marks[i] = "?"
		if c.Type != "" {
			marks[i] = "CAST(? AS " + c.Type + ")"
		}
	}
	u.head = fmt.Sprintf("INSERT INTO %s AS t (%s) VALUES ", sqlident.Quote(table), strings.Join(u.spec.Names, ", "))
	u.tuple = "(" + strings.Join(marks, ", ") + ")"
	u.tail = " " + u.spec.OnConflict(key, set)
	// DO UPDATE: each row the statement wrote returns its key as stored, quoted as an SQL
	// literal (so that equal values of different storage classes stay apart), NULL for a key
	// with a NULL (which conflicts with nothing).
	if u.keys = set != "" || len(u.cols) > len(key); u.keys {
		quoted := make([]string, len(key))
		isNull := make([]string, len(key))
		for i, k := range key {
			quoted[i] = "quote(" + sqlident.Quote(k) + ")"
			isNull[i] = sqlident.Quote(k) + " IS NULL"
		}
		u.tail += fmt.Sprintf(" RETURNING CASE WHEN %s THEN NULL ELSE %s END",
			strings.Join(isNull, " OR "), strings.Join(quoted, " || ', ' || "))
	}
}

// keyNorm is the normalisation of a key column's values by its declaration: with a type,
// the value is cast (CAST(? AS type) reads a BLOB as the text of its bytes), so a []byte and
// a string of the same bytes are one value; without, they are two (a BLOB and a TEXT).
// Nothing else: how the driver stores a time.Time depends on its connection's settings, and
// whether 7 and 7.0, or 'a' and 'A', are one key depends on the column's affinity and
// collation, which Exec finds out from the statement itself.
func keyNorm(c bulk.Column) bulk.Norm {
	if c.Type == "" {
		return nil
	}
	return bulk.BytesAsString
}

// statement returns the statement for n rows (n tuples of one placeholder per column).
func (u *Upsert) statement(n int) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if s, ok := u.byRows[n]; ok {
		return s
	}
	var b strings.Builder
	b.Grow(len(u.head) + n*(len(u.tuple)+2) + len(u.tail))
	b.WriteString(u.head)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(u.tuple)
	}
	b.WriteString(u.tail)
	s := b.String()
	if len(u.byRows) < 64 { // the full size and the remainders a caller's batches leave
		u.byRows[n] = s
	}
	return s
}

// Execer is what [Upsert.Exec] writes through: a *sql.Tx (the one a consumer handler gets
// from sqlitefence's Apply), a *sql.Conn or a *sql.DB.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Prepare prepares the statements on db, so that Exec through a transaction of db (or db
// itself) reuses them instead of having SQLite parse a statement of hundreds of placeholders
// per call, which costs about as much as running it: database/sql's counterpart of pgx's
// statement cache. It prepares one statement per power of two up to [RowsPerStatement] (and
// that size itself); Exec then writes n rows as full statements and one statement per set bit
// of the remainder. Prepare does I/O; call it once at setup, not while holding one of db's
// connections in a transaction (with a pool of one it would wait for ever). Exec through a
// transaction of another *sql.DB fails. [Upsert.Close] releases the statements.
func (u *Upsert) Prepare(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return errors.New("sqlitebulk: Prepare: nil database")
	}
	stmts := map[int]*sql.Stmt{}
	for _, n := range u.sizes() {
		st, err := db.PrepareContext(ctx, u.statement(n))
		if err != nil {
			for _, st := range stmts {
				st.Close()
			}
			return fmt.Errorf("sqlitebulk: prepare %d rows: %w", n, err)
		}
		stmts[n] = st
	}
	u.mu.Lock()
	old := u.stmts
	u.db, u.stmts = db, stmts
	u.mu.Unlock()
	for _, st := range old {
		st.Close()
	}
	return nil
}

// Close releases the statements [Upsert.Prepare] prepared; Exec runs unprepared afterwards.
func (u *Upsert) Close() error {
	u.mu.Lock()
	old := u.stmts
	u.db, u.stmts = nil, nil
	u.mu.Unlock()
	var errs []error
	for _, st := range old {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}

// sizes are the row counts of the prepared statements: the powers of two below the rows per
// statement, and that count.
func (u *Upsert) sizes() []int {
	var out []int
	for n := 1; n < u.spec.Cfg.Rows; n *= 2 {
		out = append(out, n)
	}
	return append(out, u.spec.Cfg.Rows)
}

// chunks splits a layer of n rows into statement sizes: full statements, then (prepared)
// one per set bit of the remainder, largest first, or (unprepared) the remainder at once.
func (u *Upsert) chunks(n int, prepared bool) []int {
	var out []int
	for ; n >= u.spec.Cfg.Rows; n -= u.spec.Cfg.Rows {
		out = append(out, u.spec.Cfg.Rows)
	}
	if !prepared {
		if n > 0 {
			out = append(out, n)
		}
		return out
	}
	for bit := 1 << 30; bit > 0; bit >>= 1 {
		if n&bit != 0 {
			out = append(out, bit)
		}
	}
	return out
}

// Exec writes rows (each one value per column, in the order of the columns): rows merged per
// key (with [Merge]) or split into layers of distinct keys (without), in statements of at
// most [RowsPerStatement] rows, run one after the other. Run it inside a transaction (the
// one sqlitefence's Apply hands a handler, after the fence's check and advance), so that the
// rows land all or none with the fence. It fails, writing nothing, if a row has the wrong
// number of values; it returns the first statement's error otherwise (the caller rolls back).
// A statement that wrote one database key twice (keys Go holds apart that are equal under
// the column's collation or affinity, see the package doc) fails, after SQLite wrote it (roll
// back), with an error that names the table and the key as stored and is permanent for the
// consumer (consumer.IsPermanent). Rows are not modified (Merge works on copies).
func (u *Upsert) Exec(ctx context.Context, tx Execer, rows [][]any) error {
	layers, err := u.spec.Layers("sqlitebulk", rows, len(u.cols))
	if err != nil {
		return err
	}
	u.mu.Lock()
	stmts := u.stmts
	u.mu.Unlock()
	sqlTx, isTx := tx.(*sql.Tx)
	_, isDB := tx.(*sql.DB)
	prepared := stmts != nil && (isTx || isDB)
	args := make([]any, 0, min(len(rows), u.spec.Cfg.Rows)*len(u.cols))
	for _, layer := range layers {
		for _, n := range u.chunks(len(layer), prepared) {
			args = args[:0]
			for _, r := range layer[:n] {
				args = append(args, r...)
			}
			var err error
			switch {
			case !u.keys && prepared && isTx:
				_, err = sqlTx.StmtContext(ctx, stmts[n]).ExecContext(ctx, args...)
			case !u.keys && prepared:
				_, err = stmts[n].ExecContext(ctx, args...)
			case !u.keys:
				_, err = tx.ExecContext(ctx, u.statement(n), args...)
			case prepared && isTx:
				err = u.written(n)(sqlTx.StmtContext(ctx, stmts[n]).QueryContext(ctx, args...))
			case prepared:
				err = u.written(n)(stmts[n].QueryContext(ctx, args...))
			default:
				err = u.written(n)(tx.QueryContext(ctx, u.statement(n), args...))
			}
			if err != nil {
				return err
			}
			layer = layer[n:]
		}
	}
	return nil
}

// written reads the keys a statement of n rows returns, and fails if one is there twice.
func (u *Upsert) written(n int) func(*sql.Rows, error) error {
	return func(rows *sql.Rows, err error) error {
		if err != nil {
			return fmt.Errorf("sqlitebulk: upsert %d rows: %w", n, err)
		}
		defer rows.Close()
		seen := make(map[string]struct{}, n)
		var dup string
		for rows.Next() {
			var k sql.NullString
			if err := rows.Scan(&k); err != nil {
				return fmt.Errorf("sqlitebulk: upsert %d rows: %w", n, err)
			}
			if _, ok := seen[k.String]; ok && k.Valid && dup == "" {
				dup = k.String
			}
			seen[k.String] = struct{}{}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("sqlitebulk: upsert %d rows: %w", n, err)
		}
		if dup != "" {
			return &bulk.KeyError{Pkg: "sqlitebulk", Table: u.table, Cols: u.key, Stored: "(" + dup + ")",
				Rows: n}
		}
		return rows.Close()
	}
}

// statements returns how many statements Exec would run for rows: per layer, the full
// statements and the remainder (after [Upsert.Prepare], one statement per set bit of it).
func (u *Upsert) statements(rows [][]any) int {
	u.mu.Lock()
	prepared := u.stmts != nil
	u.mu.Unlock()
	n := 0
	for _, layer := range bulk.Layers(rows, u.spec.Key, u.spec.Norm, u.spec.Cfg.Merge) {
		n += len(u.chunks(len(layer), prepared))
	}
	return n
}
