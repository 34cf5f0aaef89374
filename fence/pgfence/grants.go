package pgfence

import (
	"fmt"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/sqlident"
)

// RuntimeGrants returns the GRANT statements that give role, a least-privilege runtime role,
// exactly what the store needs at run time on its configured tables: SELECT, INSERT, UPDATE on
// the fence and keyed tables (Claim, Advance, Apply, Admit), SELECT, INSERT on the recoveries
// table (Recover appends the audit trail, never rewrites it), SELECT, INSERT on the topics table
// (a claim adopts a topic's identity the first time it sees it; rows are only appended). No DDL, no DELETE, no TRUNCATE:
// run [Store.Migrate] as the role that owns the schema (the migration role), then these as that
// role. For unqualified table names, also grant USAGE on the schema the search_path resolves
// them to. An invalid role name fails with an error wrapping fence.ErrInvalid.
func (s *Store) RuntimeGrants(role string) ([]string, error) {
	out, err := sqlident.Grants(role, []sqlident.TableGrant{
		{Table: s.tables[0], Privileges: "SELECT, INSERT, UPDATE"},
		{Table: s.tables[1], Privileges: "SELECT, INSERT"},
		{Table: s.tables[2], Privileges: "SELECT, INSERT, UPDATE"},
		{Table: s.tables[3], Privileges: "SELECT, INSERT"},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: pgfence: %w", fence.ErrInvalid, err)
	}
	return out, nil
}
