package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// FaultDBFailover crashes the PostgreSQL primary (SIGKILL) and promotes its streaming standby
// (deploy/local/postgres.sh failover), then rebuilds the old primary as the new primary's
// standby (postgres.sh rejoin), so a run can fail over again. It needs deploy/local's primary
// with a standby (postgres.sh standby start) and a multi-host Config.PostgresURL naming both
// nodes with target_session_attrs=read-write, through which the workers and the harness find
// the promoted node. It proves the failover: the node promoted is out of recovery on a higher
// timeline, the old primary refuses connections, and workers commit batches on the promoted
// node. The replication mode (synchronous_standby_names on the primary) is kept across it.
//
// Only synchronous replication loses nothing a worker was told committed; with asynchronous
// replication the promoted node can lack acknowledged fence advances, outbox rows and inbox
// admissions (DESIGN.md, "Database failover").
const FaultDBFailover FaultKind = "db-failover"

// FailoverFaults lists the kinds that need a standby: they are in neither "all" nor "every".
var FailoverFaults = []FaultKind{FaultDBFailover}

// pgNode is one host of a multi-host PostgreSQL URL.
type pgNode struct {
	addr string // host:port
	cfg  *pgx.ConnConfig
}

// pgNodes splits a multi-host URL into one connection config per host, each without the
// read-write requirement, so a standby or a promoted node can be asked about itself.
func pgNodes(url string) ([]pgNode, error) {
	base, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	type hp struct {
		host string
		port uint16
	}
	hosts := []hp{{base.Host, base.Port}}
	for _, fb := range base.Fallbacks {
		if h := (hp{fb.Host, fb.Port}); h != hosts[len(hosts)-1] {
			hosts = append(hosts, h)
		}
	}
	var out []pgNode
	for _, h := range hosts {
		c := base.Copy()
		c.Host, c.Port, c.Fallbacks, c.ValidateConnect = h.host, h.port, nil, nil
		c.ConnectTimeout = 3 * time.Second
		out = append(out, pgNode{addr: fmt.Sprintf("%s:%d", h.host, h.port), cfg: c})
	}
	return out, nil
}

// nodeState is what a node says about itself.
type nodeState struct {
	up         bool
	inRecovery bool
	timeline   int64  // of the WAL it writes (a primary) or replays (a standby)
	syncNames  string // synchronous_standby_names
}

func (n pgNode) state(ctx context.Context) nodeState {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, n.cfg)
	if err != nil {
		return nodeState{}
	}
	defer conn.Close(context.WithoutCancel(ctx))
	s := nodeState{up: true}
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'),
 CASE WHEN pg_is_in_recovery() THEN (SELECT received_tli FROM pg_stat_wal_receiver UNION ALL SELECT 0 LIMIT 1)
 ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END`).Scan(&s.inRecovery, &s.syncNames, &s.timeline)
	if err != nil {
		return nodeState{}
	}
	return s
}

// primary returns the index of the node that is up and out of recovery, and the states of all.
func primary(ctx context.Context, nodes []pgNode) (int, []nodeState) {
	states := make([]nodeState, len(nodes))
	at := -1
	for i, n := range nodes {
		states[i] = n.state(ctx)
		if states[i].up && !states[i].inRecovery && at < 0 {
			at = i
		}
	}
	return at, states
}

var errNoStandby = errors.New("chaos: db-failover needs a PostgreSQL URL naming a primary and its standby (deploy/local/postgres.sh standby start; env prints the multi-host URL)")

// dbFailover injects FaultDBFailover.
func (h *harness) dbFailover(ctx context.Context, f *Fault) {
	f.Target = "postgres"
	nodes, err := pgNodes(h.cfg.PostgresURL)
	if err == nil && len(nodes) < 2 {
		err = errNoStandby
	}
	if err != nil {
		f.Detail = err.Error()
		return
	}
	old, before := primary(ctx, nodes)
	if old < 0 {
		f.Detail = "no primary among " + addrs(nodes)
		return
	}
	mode := "async"
	if before[old].syncNames != "" {
		mode = "sync"
	}
	f.Target = "postgres " + nodes[old].addr
	t0 := time.Now()
	ok, out := h.script(ctx, "postgres.sh", "failover")
	if !ok {
		f.Detail = out
		return
	}
	promotedAt := time.Now()
	now, after := primary(ctx, nodes)
	var proof []string
	switch {
	case now < 0:
		proof = append(proof, "no node is out of recovery after the promotion")
	case now == old:
		proof = append(proof, "the old primary "+nodes[old].addr+" still serves")
	case after[now].timeline <= before[old].timeline:
		proof = append(proof, fmt.Sprintf("promoted %s on timeline %d, not above %d", nodes[now].addr, after[now].timeline, before[old].timeline))
	}
	if after[old].up {
		proof = append(proof, "the old primary "+nodes[old].addr+" still accepts connections")
	}
	// The members reconnected: batches committed on the promoted node after its promotion
	// (the harness's own pool follows the same URL, so this read reaches it too).
	workers, deadline := int64(0), time.Now().Add(30*time.Second)
	for workers == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		sleep(ctx, 250*time.Millisecond)
		_ = h.db.QueryRow(ctx, `SELECT count(DISTINCT worker) FROM chaos_applied WHERE at_ms >= $1`, promotedAt.UnixMilli()).Scan(&workers)
	}
	if workers == 0 {
		proof = append(proof, "no worker committed on the promoted node within 30s")
	}
	took := time.Since(promotedAt)
	// The old primary comes back as the new standby, in the same replication mode.
	rok, rout := h.scriptEnv(ctx, []string{"PG_STANDBY=" + mode}, "postgres.sh", "rejoin")
	if !rok {
		proof = append(proof, "rejoin: "+rout)
	}
	if len(proof) > 0 {
		f.Detail = fmt.Sprintf("%s failover: %v", mode, proof)
		return
	}
	f.Bit = true
	f.Detail = fmt.Sprintf("%s: %s killed, %s promoted (in recovery: false, timeline %d -> %d) in %s; %d workers committed on it within %s; %s rejoined as its standby",
		mode, nodes[old].addr, nodes[now].addr, before[old].timeline, after[now].timeline,
		promotedAt.Sub(t0).Round(10*time.Millisecond), workers, took.Round(10*time.Millisecond), nodes[old].addr)
	sleep(ctx, h.cfg.SessionTimeout)
}

func addrs(nodes []pgNode) string {
	s := ""
	for i, n := range nodes {
		if i > 0 {
			s += ","
		}
		s += n.addr
	}
	return s
}

// scriptEnv is harness.script with env added to the script's environment.
func (h *harness) scriptEnv(ctx context.Context, env []string, name string, args ...string) (bool, string) {
	cmd := exec.CommandContext(ctx, filepath.Join(h.cfg.DeployDir, name), args...)
	cmd.Env = append(append(os.Environ(), h.cfg.ScriptEnv...), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf("%s %s: %v: %s", name, strings.Join(args, " "), err, lastLine(out))
	}
	return true, lastLine(out)
}
