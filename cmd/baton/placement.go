package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/shard"
)

// The placement commands: show and move a sharded sink's placement (fence/shard). The
// shards are the PostgreSQL databases of $BATON_POSTGRES_SHARD_URLS, home first.

func placementCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, placementUsage)
		return usageError{err: errors.New("placement: show or move?"), printed: true}
	}
	switch args[0] {
	case "show":
		return placementShow(ctx, args[1:], stdout, stderr)
	case "move":
		return placementMove(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, placementUsage)
		return nil
	}
	fmt.Fprint(stderr, placementUsage)
	return usageError{err: fmt.Errorf("placement: unknown subcommand %q", args[0]), printed: true}
}

const placementUsage = `usage: baton placement show|move [flags]

The placement of a sharded sink: which PostgreSQL database (shard) of $` + envShards + `
holds each partition's fence, state and outbox rows. The home shard (the first) stores the
placement's history.

  show   the placement in force: its version, the shards, the listed entries, every
         version with its reason, and moves begun but not published
  move   move one partition to another shard (retire, seed, copy, publish; run it again to
         finish a move that was interrupted)
`

// placementFlags are the flags both subcommands take.
type placementFlags struct {
	fenceTable, outboxTable string
	timeout                 time.Duration
}

func (f *placementFlags) register(fs interface {
	StringVar(*string, string, string, string)
	DurationVar(*time.Duration, string, time.Duration, string)
}) {
	fs.StringVar(&f.fenceTable, "fence-table", "", "the fence table in every shard (default baton_fences)")
	fs.StringVar(&f.outboxTable, "outbox-table", "", "the outbox table in every shard (default baton_outbox; its cursors table derives from it)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for each shard to answer when connecting")
}

// shardSet is the open shards of $BATON_POSTGRES_SHARD_URLS.
type shardSet struct {
	names  []string // home first
	pools  map[string]*pgxpool.Pool
	stores map[string]shard.Shard[pgx.Tx]
}

func (s *shardSet) close() {
	for _, p := range s.pools {
		p.Close()
	}
}

func openShards(ctx context.Context, f placementFlags) (*shardSet, error) {
	urls, err := shardURLs()
	if err != nil {
		return nil, usageError{err: err}
	}
	if len(urls) == 0 {
		return nil, usageError{err: fmt.Errorf("$%s is not set: the placement commands need the shards' databases", envShards)}
	}
	s := &shardSet{pools: map[string]*pgxpool.Pool{}, stores: map[string]shard.Shard[pgx.Tx]{}}
	var opts []pgfence.Option
	if f.fenceTable != "" {
		opts = append(opts, pgfence.Table(f.fenceTable))
	}
	for _, u := range urls {
		cfg, err := pgxpool.ParseConfig(u.URL)
		if err != nil {
			s.close()
			// Not echoed: the URL may carry a password.
			return nil, usageError{err: fmt.Errorf("$%s: shard %s: the URL does not parse", envShards, u.Name)}
		}
		cctx, cancel := context.WithTimeout(ctx, f.timeout)
		pool, err := pgxpool.NewWithConfig(cctx, cfg)
		if err == nil {
			err = pool.Ping(cctx)
		}
		cancel()
		if err != nil {
			if pool != nil {
				pool.Close()
			}
			s.close()
			return nil, fmt.Errorf("shard %s: %w", u.Name, err)
		}
		st, err := pgfence.New(pool, opts...)
		if err != nil {
			pool.Close()
			s.close()
			return nil, usageError{err: err}
		}
		s.names = append(s.names, u.Name)
		s.pools[u.Name] = pool
		s.stores[u.Name] = st
	}
	return s, nil
}

func (s *shardSet) router(ctx context.Context) (shard.Router[pgx.Tx], error) {
	return shard.New(ctx, s.names[0], s.stores, shard.Postgres(s.pools[s.names[0]]))
}

func placementShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("placement show", "[flags]", `The placement in force (its version, the default rule's shards, the listed entries), the
shards of $`+envShards+` (home first), every stored version with the reason it was
published for and when, and each move begun and not published: a partition whose fence is
retired for the next version (run 'baton placement move' again to finish it).
`, stderr)
	var f placementFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	s, err := openShards(ctx, f)
	if err != nil {
		return err
	}
	defer s.close()
	h, err := shard.Postgres(s.pools[s.names[0]]).History(ctx)
	if err != nil {
		return err
	}
	if len(h) == 0 {
		return fmt.Errorf("no placement published in the home shard %s", s.names[0])
	}
	cur := h[len(h)-1].Placement
	fmt.Fprintf(stdout, "placement %d\n", cur.Version)
	fmt.Fprintf(stdout, "rule shards: %s\n", strings.Join(cur.Shards, ", "))
	fmt.Fprintf(stdout, "shards: %s (home: %s)\n", strings.Join(s.names, ", "), s.names[0])
	keys := make([]fence.Key, 0, len(cur.Entries))
	for k := range cur.Entries {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b fence.Key) int { return strings.Compare(a.String(), b.String()) })
	fmt.Fprintf(stdout, "entries: %d\n", len(keys))
	for _, k := range keys {
		fmt.Fprintf(stdout, "  %s -> %s\n", k, cur.Entries[k])
	}
	fmt.Fprintln(stdout, "history:")
	for _, r := range h {
		fmt.Fprintf(stdout, "  %d  %s  %s\n", r.Placement.Version, r.At.UTC().Format(time.RFC3339), r.Reason)
	}
	table := f.fenceTable
	if table == "" {
		table = "baton_fences"
	}
	marker := "baton.shard/retired@v" + strconv.FormatInt(cur.Version+1, 10)
	var pending []string
	for _, n := range s.names {
		rows, err := s.pools[n].Query(ctx, `SELECT group_id, topic, partition FROM `+pgx.Identifier{table}.Sanitize()+` WHERE claimant = $1 ORDER BY 1, 2, 3`, marker)
		if err != nil {
			return fmt.Errorf("shard %s: %w", n, err)
		}
		ks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[fence.Key])
		if err != nil {
			return fmt.Errorf("shard %s: %w", n, err)
		}
		for _, k := range ks {
			pending = append(pending, fmt.Sprintf("  %s retired on %s for placement %d, not published", k, n, cur.Version+1))
		}
	}
	if len(pending) > 0 {
		fmt.Fprintln(stdout, "moves begun:")
		for _, p := range pending {
			fmt.Fprintln(stdout, p)
		}
	}
	return nil
}

func placementMove(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("placement move", "-key GROUP/TOPIC/PARTITION -to SHARD [flags]", `Moves one partition to another shard: retires its fence on the shard it lives on (waiting for
a batch in flight there), seeds its fence on -to above every token the old shard accepted,
copies its outbox rows not yet delivered and its outbox cursor in the transaction that
advances the new fence to the old one's position, then publishes the next placement. Each
step is recorded (the recoveries on both shards, the placement's reason). A move interrupted
anywhere is finished by running the same command again.

The application's own rows of the partition are not copied by this command: a partition
whose handler keeps state in tables of its own is moved by a program that calls the router's
Move with a copy function for them.
`, stderr)
	var f placementFlags
	f.register(fs)
	keyFlag := fs.String("key", "", "the partition to move: GROUP/TOPIC/PARTITION (required)")
	to := fs.String("to", "", "the shard to move it to, a name of $"+envShards+" (required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	k, err := parseKey(*keyFlag)
	if err != nil {
		return usageError{err: err}
	}
	if *to == "" {
		return usageError{err: errors.New("-to is required")}
	}
	s, err := openShards(ctx, f)
	if err != nil {
		return err
	}
	defer s.close()
	if _, ok := s.pools[*to]; !ok {
		return usageError{err: fmt.Errorf("-to %q is not a shard of $%s (%s)", *to, envShards, strings.Join(s.names, ", "))}
	}
	r, err := s.router(ctx)
	if err != nil {
		return err
	}
	from := r.Placement().Shard(k)
	if from == *to {
		fmt.Fprintf(stdout, "%s is on %s already (placement %d)\n", k, from, r.Placement().Version)
		return nil
	}
	box := outboxTables(f.outboxTable)
	if err := r.Move(ctx, k, *to, func(ctx context.Context, k fence.Key, from string, tx pgx.Tx) error {
		return copyOutbox(ctx, s.pools[from], tx, box, k)
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "moved %s from %s to %s: placement %d\n", k, from, *to, r.Placement().Version)
	return nil
}

// parseKey parses GROUP/TOPIC/PARTITION. A group may hold '/', a topic may not (Kafka's
// topic names are [a-zA-Z0-9._-]), so the topic and partition are the last two fields.
func parseKey(s string) (fence.Key, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return fence.Key{}, fmt.Errorf("-key %q: want GROUP/TOPIC/PARTITION", s)
	}
	j := strings.LastIndexByte(s[:i], '/')
	if j <= 0 || j+1 == i {
		return fence.Key{}, fmt.Errorf("-key %q: want GROUP/TOPIC/PARTITION", s)
	}
	p, err := strconv.ParseInt(s[i+1:], 10, 32)
	if err != nil || p < 0 {
		return fence.Key{}, fmt.Errorf("-key %q: %q is not a partition number", s, s[i+1:])
	}
	return fence.Key{Group: s[:j], Topic: s[j+1 : i], Partition: int32(p)}, nil
}

type outboxNames struct{ rows, cursors string }

func outboxTables(table string) outboxNames {
	if table == "" {
		table = "baton_outbox"
	}
	return outboxNames{rows: table, cursors: table + "_cursors"}
}

// copyOutbox copies partition k's outbox state from the old shard (src: nothing of k changes
// there, its fence is retired) into the new shard's transaction: the cursor (the last sequence
// handed out and the last delivered, so a sequence is never handed out twice and a delivered
// row never relayed again) and the rows not yet delivered, with their sequences and the
// tokens they were appended under. A shard without the outbox tables has nothing to copy.
func copyOutbox(ctx context.Context, src *pgxpool.Pool, tx pgx.Tx, t outboxNames, k fence.Key) error {
	var exists bool
	if err := src.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.cursors).Scan(&exists); err != nil || !exists {
		return err
	}
	rows, cursors := pgx.Identifier{t.rows}.Sanitize(), pgx.Identifier{t.cursors}.Sanitize()
	// The destination's rows of the partition become the source's: what an earlier stay left
	// there goes first.
	for _, table := range []string{rows, cursors} {
		if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE group_id = $1 AND topic = $2 AND partition = $3`, k.Group, k.Topic, k.Partition); err != nil {
			return err
		}
	}
	var last, delivered int64
	err := src.QueryRow(ctx, `SELECT last_seq, delivered_seq FROM `+cursors+` WHERE group_id = $1 AND topic = $2 AND partition = $3`,
		k.Group, k.Topic, k.Partition).Scan(&last, &delivered)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // the partition never appended
	}
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+cursors+` (group_id, topic, partition, last_seq, delivered_seq) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (group_id, topic, partition) DO UPDATE SET last_seq = excluded.last_seq, delivered_seq = excluded.delivered_seq`,
		k.Group, k.Topic, k.Partition, last, delivered); err != nil {
		return err
	}
	const cols = `group_id, topic, partition, seq, era, epoch, dest_topic, msg_key, msg_value, headers, idempotency_key, traceparent, tracestate, created_at`
	pending, err := src.Query(ctx, `SELECT `+cols+` FROM `+rows+` WHERE group_id = $1 AND topic = $2 AND partition = $3 AND seq > $4 ORDER BY seq`,
		k.Group, k.Topic, k.Partition, delivered)
	if err != nil {
		return err
	}
	vals, err := pgx.CollectRows(pending, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	if err != nil {
		return err
	}
	for _, v := range vals {
		if _, err := tx.Exec(ctx, `INSERT INTO `+rows+` (`+cols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
			ON CONFLICT (group_id, topic, partition, seq) DO NOTHING`, v...); err != nil {
			return err
		}
	}
	return nil
}
