package chaos

import (
	"context"
	"fmt"
	"sort"

	"github.com/batonhq/baton/fence"
)

// Verdict is what the checker found after a run. Every count is read back from the database
// the workers wrote to; nothing is taken from the workers' own word except the attempt log,
// which they write outside the transaction it describes.
type Verdict struct {
	Expected int64 // records produced

	Applied    int64 // records folded into the state (sum of per-key counts)
	KeysWrong  int   // keys whose final state differs from the fold of their records
	Lost       int64 // records missing from keys that have too few
	Duplicated int64 // records applied more than once (excess on keys with too many)
	Disorder   int64 // applies that were not the key's next sequence number

	Batches         int64            // committed batches in the applied log
	StaleCommits    int64            // committed batches whose token is lower than one committed before them on the partition
	OverlapBatches  int64            // committed batches whose offsets overlap a batch committed before them
	Attempts        map[string]int64 // write attempts by outcome (the Outcome* constants)
	Errors          []ErrorGroup     // the attempts with outcome error, by cause, most frequent first
	ZombieAttempts  int64            // attempts made by a writer that had been frozen past its session timeout
	ZombieRefused   int64            // of those, refused by the fence as stale
	ZombieAborted   int64            // of those, failed otherwise (a held transaction ended by the database)
	ZombieCommitted int64            // of those, committed (a lock let a zombie write)
	Recoveries      int64            // recorded era advances after an epoch regression (fenced mode)

	CommandsExpected   int64 // commands the workload sent through the outbox (0: none)
	CommandsApplied    int64 // commands the receiver applied through the inbox
	CommandsMissing    int64 // expected commands never applied
	CommandsDuplicated int64 // commands applied more than once
	CommandsDisorder   int64 // commands applied after a later command of the same key from the same destination topic
	// CommandsInverted counts commands applied after a later command of the same key that came
	// through the other destination topic (Workload.CommandTopics = 2): not a violation, the
	// interleaving a receiver of two topics must survive, counted to show it happened.
	CommandsInverted int64

	// SameTokenWriters counts partitions (and tokens) under which batches of more than one
	// worker committed: two writers presenting one token (the equal-token race). A token is
	// one claimant's.
	SameTokenWriters int64
	// ZombieOverTaken counts committed writes of a frozen-and-resumed worker's old assignment
	// (its held write, or a later one at the held epoch or below: attempts flagged zombie or
	// resumed) made after another worker had committed on the partition at that epoch or a
	// later one: a zombie that wrote after its takeover, whatever token the fence let it use
	// (a stale proof of currentness followed by a recovery).
	ZombieOverTaken int64
	// HeldApplied counts batches committed on a source topic between its recreation or growth
	// and the operator's reset or acknowledgement (the topic faults: chaos_topic_changes): the
	// consumer must hold every partition of such a topic until then.
	HeldApplied int64

	// Invariants are an [App]'s own, as its Check judged them (none for the built-in workload).
	Invariants []Invariant
}

// ErrorGroup is the write attempts that failed with an error of one cause.
type ErrorGroup struct {
	Cause   string // Cause*; "postgres" with a SQLSTATE
	Count   int64
	Example string // one of the attempts' error messages
}

// OK reports whether every data invariant holds: nothing lost, nothing applied twice, every
// key in order, and no stale or overlapping commit.
func (v Verdict) OK() bool {
	return v.KeysWrong == 0 && v.Lost == 0 && v.Duplicated == 0 && v.Disorder == 0 &&
		v.StaleCommits == 0 && v.OverlapBatches == 0 && v.Applied == v.Expected &&
		v.SameTokenWriters == 0 && v.ZombieOverTaken == 0 && v.HeldApplied == 0 &&
		v.CommandsMissing == 0 && v.CommandsDuplicated == 0 && v.CommandsDisorder == 0 &&
		v.invariantsHold()
}

func (v Verdict) invariantsHold() bool {
	for _, i := range v.Invariants {
		if i.Violations != 0 {
			return false
		}
	}
	return true
}

// Violations lists the broken invariants in words, empty when OK.
func (v Verdict) Violations() []string {
	var out []string
	if v.Lost > 0 {
		out = append(out, fmt.Sprintf("%d records lost", v.Lost))
	}
	if v.Duplicated > 0 {
		out = append(out, fmt.Sprintf("%d records applied twice", v.Duplicated))
	}
	if v.Disorder > 0 {
		out = append(out, fmt.Sprintf("%d out-of-order applies", v.Disorder))
	}
	if v.KeysWrong > 0 {
		out = append(out, fmt.Sprintf("%d keys with a wrong final state", v.KeysWrong))
	}
	if v.StaleCommits > 0 {
		out = append(out, fmt.Sprintf("%d batches committed under a stale token", v.StaleCommits))
	}
	if v.OverlapBatches > 0 {
		out = append(out, fmt.Sprintf("%d batches re-applied offsets already applied", v.OverlapBatches))
	}
	if v.SameTokenWriters > 0 {
		out = append(out, fmt.Sprintf("%d tokens under which two workers committed", v.SameTokenWriters))
	}
	if v.ZombieOverTaken > 0 {
		out = append(out, fmt.Sprintf("%d zombie writes committed after their takeover", v.ZombieOverTaken))
	}
	if v.HeldApplied > 0 {
		out = append(out, fmt.Sprintf("%d batches applied from a recreated or grown topic before the operator released it", v.HeldApplied))
	}
	if v.CommandsMissing > 0 {
		out = append(out, fmt.Sprintf("%d commands never delivered", v.CommandsMissing))
	}
	if v.CommandsDuplicated > 0 {
		out = append(out, fmt.Sprintf("%d commands applied twice", v.CommandsDuplicated))
	}
	if v.CommandsDisorder > 0 {
		out = append(out, fmt.Sprintf("%d commands applied out of order", v.CommandsDisorder))
	}
	for _, i := range v.Invariants {
		if i.Violations != 0 {
			out = append(out, i.String())
		}
	}
	if v.Applied != v.Expected && v.Lost == 0 && v.Duplicated == 0 {
		out = append(out, fmt.Sprintf("%d records applied, %d expected", v.Applied, v.Expected))
	}
	return out
}

// Check reads the workload's tables and verifies the invariants for workload w.
func Check(ctx context.Context, db DB, w Workload) (Verdict, error) {
	v := Verdict{Expected: int64(w.Total()), Attempts: map[string]int64{}}
	if err := checkFold(ctx, db, w, &v); err != nil {
		return v, err
	}
	if w.CommandEvery > 0 {
		if err := checkCommands(ctx, db, w, &v); err != nil {
			return v, err
		}
	}
	return v, checkLog(ctx, db, &v)
}

// CheckApp verifies an application's run: its own invariants (app.Check) and the harness's
// (the applied log, the attempt log, the recoveries).
func CheckApp(ctx context.Context, env AppEnv, app App) (Verdict, error) {
	v := Verdict{Attempts: map[string]int64{}}
	inv, err := app.Check(ctx, env)
	if err != nil {
		return v, fmt.Errorf("chaos: %s: check: %w", app.Name(), err)
	}
	sortInvariants(inv)
	v.Invariants = inv
	if b, ok := app.(*builtin); ok {
		if err := b.verdict(ctx, env, &v); err != nil {
			return v, err
		}
	}
	return v, checkLog(ctx, env.DB, &v)
}

// checkFold checks the built-in workload's per-key state against the fold of its records.
func checkFold(ctx context.Context, db DB, w Workload, v *Verdict) error {
	per := int64(w.PerKey)
	wantSum := per * (per - 1) / 2
	seen := map[string]bool{}
	rows, err := db.Query(ctx, `SELECT k, n, last_seq, sum_seq, disorder FROM chaos_state`)
	if err != nil {
		return fmt.Errorf("chaos: check state: %w", err)
	}
	for rows.Next() {
		var k string
		var n, last, sum, disorder int64
		if err := rows.Scan(&k, &n, &last, &sum, &disorder); err != nil {
			rows.Close()
			return err
		}
		seen[k] = true
		v.Applied += n
		v.Disorder += disorder
		if n < per {
			v.Lost += per - n
		}
		if n > per {
			v.Duplicated += n - per
		}
		if n != per || sum != wantSum || last != per-1 || disorder != 0 {
			v.KeysWrong++
			// Equal counts with a wrong sum: as many lost as duplicated. Count the difference
			// of sums as at least one of each, so a masked violation still shows.
			if n == per && sum != wantSum {
				v.Lost++
				v.Duplicated++
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i := 0; i < w.Keys; i++ {
		if !seen[Key(i)] {
			v.KeysWrong++
			v.Lost += per
		}
	}
	return nil
}

// checkLog checks what every run logs, whatever its workload: the applied log (no stale
// commit, no re-applied offsets, per topic partition), the fence's recoveries and the attempts.
func checkLog(ctx context.Context, db DB, v *Verdict) error {
	type batch struct {
		first, last int64
		tok         fence.Token
		worker      string
		at          int64
	}
	type lane struct {
		topic string
		part  int32
	}
	byPart := map[lane][]batch{}
	rows, err := db.Query(ctx, `SELECT topic, part, first_off, last_off, era, epoch, worker, at_ms FROM chaos_applied ORDER BY id`)
	if err != nil {
		return fmt.Errorf("chaos: check applied log: %w", err)
	}
	for rows.Next() {
		var l lane
		var b batch
		if err := rows.Scan(&l.topic, &l.part, &b.first, &b.last, &b.tok.Era, &b.tok.Epoch, &b.worker, &b.at); err != nil {
			rows.Close()
			return err
		}
		byPart[l] = append(byPart[l], b)
		v.Batches++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	// A recreated topic's offsets start again at 0 in the era its reset moved each fence to:
	// re-applied offsets are looked for within one incarnation; tokens rise across them.
	incs, err := incarnations(ctx, db)
	if err != nil {
		return err
	}
	for l, bs := range byPart {
		var maxTok fence.Token
		maxOff := map[int]int64{}
		writers := map[fence.Token]string{}
		for _, b := range bs {
			inc := 0
			for _, era := range incs[incKey(l)] {
				if era <= b.tok.Era {
					inc++
				}
			}
			if _, ok := maxOff[inc]; !ok {
				maxOff[inc] = -1
			}
			if w, ok := writers[b.tok]; !ok {
				writers[b.tok] = b.worker
			} else if w != b.worker && w != "" {
				v.SameTokenWriters++
				writers[b.tok] = "" // count each token once
			}
			if b.tok.Compare(maxTok) < 0 {
				v.StaleCommits++
			}
			if b.first <= maxOff[inc] {
				v.OverlapBatches++
			}
			if maxTok.Compare(b.tok) < 0 {
				maxTok = b.tok
			}
			if b.last > maxOff[inc] {
				maxOff[inc] = b.last
			}
		}
	}

	// Nothing applied from a recreated or grown topic before the operator released it.
	rows, err = db.Query(ctx, `SELECT topic, changed_ms, released_ms FROM chaos_topic_changes ORDER BY id`)
	if err != nil {
		return fmt.Errorf("chaos: check topic changes: %w", err)
	}
	for rows.Next() {
		var topic string
		var changed, released int64
		if err := rows.Scan(&topic, &changed, &released); err != nil {
			rows.Close()
			return err
		}
		for l, bs := range byPart {
			if l.topic != topic {
				continue
			}
			for _, b := range bs {
				if b.at >= changed && (released == 0 || b.at < released) {
					v.HeldApplied++
				}
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}

	// The fence's recovery log, when the store uses the default table name; absent otherwise.
	if err := db.QueryRow(ctx, `SELECT count(*) FROM baton_fences_recoveries`).Scan(&v.Recoveries); err != nil {
		v.Recoveries = 0
	}
	// A resumed zombie's committed writes, against the other workers' commits before them.
	// Tokens compare as (era, epoch): an epoch of an earlier era (before a group was
	// recreated, a topic reset, a recovery) is lower whatever its number.
	takenOver := func(topic string, part int32, worker string, tok fence.Token, at int64) bool {
		for _, b := range byPart[lane{topic, part}] {
			if b.worker != worker && b.tok.Compare(tok) >= 0 && b.at <= at {
				return true
			}
		}
		return false
	}
	rows, err = db.Query(ctx, `SELECT worker, topic, part, era, epoch, at_ms FROM chaos_attempts WHERE outcome = $1 AND (zombie OR resumed) ORDER BY id`, OutcomeCommitted)
	if err != nil {
		return fmt.Errorf("chaos: check zombie attempts: %w", err)
	}
	for rows.Next() {
		var worker, topic string
		var part int32
		var era, epoch, at int64
		if err := rows.Scan(&worker, &topic, &part, &era, &epoch, &at); err != nil {
			rows.Close()
			return err
		}
		if takenOver(topic, part, worker, fence.Token{Era: era, Epoch: epoch}, at) {
			v.ZombieOverTaken++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}

	rows, err = db.Query(ctx, `SELECT outcome, cause, zombie, detail FROM chaos_attempts ORDER BY id`)
	if err != nil {
		return fmt.Errorf("chaos: check attempts: %w", err)
	}
	errs := map[string]*ErrorGroup{}
	for rows.Next() {
		var outcome, cause, detail string
		var zombie bool
		if err := rows.Scan(&outcome, &cause, &zombie, &detail); err != nil {
			rows.Close()
			return err
		}
		v.Attempts[outcome]++
		if outcome == OutcomeError {
			if cause == "" {
				cause = CauseOther
			}
			g := errs[cause]
			if g == nil {
				g = &ErrorGroup{Cause: cause, Example: detail}
				errs[cause] = g
			}
			g.Count++
		}
		if zombie {
			v.ZombieAttempts++
			switch outcome {
			case OutcomeStale:
				v.ZombieRefused++
			case OutcomeCommitted:
				v.ZombieCommitted++
			default:
				v.ZombieAborted++
			}
		}
	}
	rows.Close()
	for _, g := range errs {
		v.Errors = append(v.Errors, *g)
	}
	sort.Slice(v.Errors, func(i, j int) bool {
		a, b := v.Errors[i], v.Errors[j]
		return a.Count > b.Count || a.Count == b.Count && a.Cause < b.Cause
	})
	return rows.Err()
}

// Attempt outcomes recorded in chaos_attempts.
const (
	OutcomeCommitted = "committed"
	OutcomeStale     = "stale"
	OutcomeDuplicate = "duplicate"
	OutcomeError     = "error"
	// Not write outcomes but markers a freeze fault logs before the held write: the worker
	// froze before it (frozen) or inside its transaction, before the commit (delayed).
	OutcomeFrozen  = "frozen"
	OutcomeDelayed = "delayed"
)

// AttemptKinds lists the outcomes in a stable order, for reports.
func (v Verdict) AttemptKinds() []string {
	ks := make([]string, 0, len(v.Attempts))
	for k := range v.Attempts {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// checkCommands verifies the commands the receiver applied: each expected (key, seq) exactly
// once, and per key in increasing seq order (in the order the receiver committed them).
func checkCommands(ctx context.Context, db DB, w Workload, v *Verdict) error {
	v.CommandsExpected = int64(w.Commands() * w.Keys)
	seen := map[string]map[int64]int{}
	type lane struct{ k, topic string }
	last := map[lane]int64{}
	maxSeq := map[string]int64{}
	rows, err := db.Query(ctx, `SELECT k, seq, topic FROM chaos_commands ORDER BY id`)
	if err != nil {
		return fmt.Errorf("chaos: check commands: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, topic string
		var seq int64
		if err := rows.Scan(&k, &seq, &topic); err != nil {
			return err
		}
		v.CommandsApplied++
		if seen[k] == nil {
			seen[k] = map[int64]int{}
		}
		seen[k][seq]++
		if seen[k][seq] > 1 {
			v.CommandsDuplicated++
		}
		if l, ok := last[lane{k, topic}]; ok && seq <= l {
			v.CommandsDisorder++
		} else if m, ok := maxSeq[k]; ok && seq < m {
			v.CommandsInverted++ // after a later command from the other topic
		}
		last[lane{k, topic}] = seq
		if m, ok := maxSeq[k]; !ok || seq > m {
			maxSeq[k] = seq
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := 0; i < w.Keys; i++ {
		for seq := int64(0); seq < int64(w.PerKey); seq += int64(w.CommandEvery) {
			if seen[Key(i)][seq] == 0 {
				v.CommandsMissing++
			}
		}
	}
	return nil
}

type incKey struct {
	topic string
	part  int32
}

// incarnations returns, per topic partition, the eras at which the topic's later incarnations
// start (each a reset after a recreation, recorded by the harness in chaos_incarnations).
func incarnations(ctx context.Context, db DB) (map[incKey][]int64, error) {
	rows, err := db.Query(ctx, `SELECT topic, part, era FROM chaos_incarnations`)
	if err != nil {
		return nil, fmt.Errorf("chaos: read incarnations: %w", err)
	}
	defer rows.Close()
	out := map[incKey][]int64{}
	for rows.Next() {
		var k incKey
		var era int64
		if err := rows.Scan(&k.topic, &k.part, &era); err != nil {
			return nil, err
		}
		out[k] = append(out[k], era)
	}
	return out, rows.Err()
}
