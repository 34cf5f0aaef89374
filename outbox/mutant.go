package outbox

// mutant names a deliberately broken variant of the outbox package, for the mutation tests
// only: a build with the batonmutant tag reads it from BATON_OUTBOX_MUTANT (mutant_batonmutant.go)
// and internal/chaos's mutant tests require the chaos checker to catch it. It is empty in every
// default build, where each mutation point costs one comparison with an empty string.
var mutant string

// The named mutants.
const (
	// mutantInboxScopeNoDestination scopes admissions by (receiver, source partition, key)
	// only, as before finding 6 of issue 10: a receiver reading two destination topics with one
	// inbox drops a never-applied record as a duplicate when it reads them out of order.
	mutantInboxScopeNoDestination = "InboxScopeIgnoresDestination"
)

func isMutant(m string) bool { return mutant != "" && mutant == m }
