package shard

import (
	"fmt"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/sqlident"
)

// Schema returns the placement table's DDL, as Migrate runs it.
func (pgPlacements) Schema() string { return pgSchema + ";" }

// RuntimeGrants returns the GRANT giving role, a least-privilege runtime role, what a router
// needs of the placement table at run time: SELECT (New and every claim load the placement in
// force). Publishing a placement is an operator's step, run as a role that may insert.
func (pgPlacements) RuntimeGrants(role string) ([]string, error) {
	out, err := sqlident.Grants(role, []sqlident.TableGrant{{Table: "baton_placements", Privileges: "SELECT"}})
	if err != nil {
		return nil, fmt.Errorf("%w: shard: %w", fence.ErrInvalid, err)
	}
	return out, nil
}

// Schema returns the placement table's DDL, as Migrate runs it.
func (sqlitePlacements) Schema() string { return sqliteSchema + ";" }
