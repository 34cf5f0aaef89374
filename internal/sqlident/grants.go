package sqlident

import (
	"errors"
	"fmt"
	"strings"
)

// TableGrant is the privileges a runtime role needs on one table, e.g. "SELECT, INSERT, UPDATE".
type TableGrant struct {
	Table      string // "table" or "schema.table", validated
	Privileges string
}

// Grants returns the GRANT statements (PostgreSQL) giving role exactly the privileges listed:
// USAGE on each schema named by a schema-qualified table (an unqualified table resolves through
// the search_path, whose schema the caller grants), then each table's privileges. It grants no
// DDL, no TRUNCATE, nothing on the database. The role and every table are validated; every
// problem is reported, joined.
func Grants(role string, tables []TableGrant) ([]string, error) {
	var errs []error
	if err := validatePart(role); err != nil {
		errs = append(errs, fmt.Errorf("%w: role %q: %s", ErrInvalid, role, err))
	}
	var out []string
	seen := map[string]bool{}
	for _, g := range tables {
		if err := Validate(g.Table); err != nil {
			errs = append(errs, err)
			continue
		}
		if i := strings.IndexByte(g.Table, '.'); i > 0 && !seen[g.Table[:i]] {
			seen[g.Table[:i]] = true
			out = append(out, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", Quote(g.Table[:i]), Quote(role)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, g := range tables {
		out = append(out, fmt.Sprintf("GRANT %s ON TABLE %s TO %s", g.Privileges, Quote(g.Table), Quote(role)))
	}
	return out, nil
}
