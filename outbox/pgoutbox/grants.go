package pgoutbox

import (
	"fmt"

	"github.com/batonhq/baton/internal/sqlident"
	"github.com/batonhq/baton/outbox"
)

// RuntimeGrants returns the GRANT statements that give role, a least-privilege runtime role,
// what the store needs at run time: SELECT, INSERT, UPDATE on the outbox and cursors tables
// (Append, the relay's reads and marks), DELETE on the outbox table only (Cleanup removes
// delivered rows; leave that statement out if Cleanup runs as another role), and SELECT,
// UPDATE on the pgfence fence table (Append and the mark lock the fence row FOR SHARE, which
// PostgreSQL allows only with UPDATE; pgfence's own RuntimeGrants grant it too), and SELECT,
// INSERT on the dead-letter table (the relay's fenced DeadLetter; DeadLetters reads it). No DDL, no
// TRUNCATE. Run [Store.Migrate] as the role that owns the schema, then these as that role. An
// invalid role name fails with an error wrapping outbox.ErrInvalid.
func (s *Store) RuntimeGrants(role string) ([]string, error) {
	out, err := sqlident.Grants(role, []sqlident.TableGrant{
		{Table: s.tables[0], Privileges: "SELECT, INSERT, UPDATE, DELETE"},
		{Table: s.tables[1], Privileges: "SELECT, INSERT, UPDATE"},
		{Table: s.tables[2], Privileges: "SELECT, UPDATE"},
		{Table: s.tables[3], Privileges: "SELECT, INSERT"},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: pgoutbox: %w", outbox.ErrInvalid, err)
	}
	return out, nil
}
