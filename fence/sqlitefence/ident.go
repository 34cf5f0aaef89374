package sqlitefence

import (
	"fmt"
	"strings"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/sqlident"
)

// Suffixes of the companion tables derived from the fence table's name.
const (
	suffixRecovery      = "_recoveries"
	suffixRecoveryIndex = "_recoveries_idx"
	suffixKeyed         = "_keyed"
	suffixTopics        = "_topics"
)

// validateTable checks the fence table name and every name derived from it, since table names
// are spliced into SQL text.
func validateTable(name string) error {
	for _, n := range []string{name, name + suffixRecovery, name + suffixRecoveryIndex, name + suffixKeyed, name + suffixTopics} {
		if err := sqlident.Validate(n); err != nil {
			return fmt.Errorf("%w: table name: %w", fence.ErrInvalid, err)
		}
	}
	return nil
}

// names are the quoted identifiers a store splices into its SQL.
type names struct {
	fence, recovery, keyed, topics string
	// recoveryIndex is schema-qualified like the tables; recoveryBare is the recovery table
	// without its schema, as CREATE INDEX requires in its ON clause.
	recoveryIndex, recoveryBare string
}

func newNames(table string) names {
	bare := table
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		bare = table[i+1:]
	}
	return names{
		fence:         sqlident.Quote(table),
		recovery:      sqlident.Quote(table + suffixRecovery),
		keyed:         sqlident.Quote(table + suffixKeyed),
		topics:        sqlident.Quote(table + suffixTopics),
		recoveryIndex: sqlident.Quote(table + suffixRecoveryIndex),
		recoveryBare:  sqlident.Quote(bare + suffixRecovery),
	}
}
