package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The network faults: a worker's links to the broker and to the database, cut or degraded
// with tc on both ends of the worker's veth (netns.go). Each counts (Fault.Bit) only when both sides of
// the link showed it: the member's packets dropped on the link (tc's counters) and the other
// end's view (the group coordinator expiring or keeping the member, the database answering).
const (
	// Cut a writer's link to the brokers while its link to the database stays up, with a
	// write held (the process runs on): the member expires, another takes its partitions
	// over, then the held write is released, still cut from the brokers: a zombie's write,
	// which the fence must refuse. The link heals after.
	FaultNetBrokerCut FaultKind = "net-broker-cut"
	// Cut a writer's link to PostgreSQL while its link to the brokers stays up, past the
	// session timeout: its transactions hang, the group keeps it, it commits nothing.
	FaultNetDBCut FaultKind = "net-db-cut"
	// Delay, loss, reordering and duplication both ways on a writer's link, for a while.
	FaultNetFlaky FaultKind = "net-flaky"
	// Cut a writer's link to the brokers while it holds a transaction open, heal the cut after
	// the takeover, then let the transaction commit: PostgreSQL ended it, the fence refuses.
	FaultNetHealMidTx FaultKind = "net-heal-mid-tx"
)

// NetFaults lists the network kinds. They need root, network namespaces and PostgreSQL.
var NetFaults = []FaultKind{FaultNetBrokerCut, FaultNetDBCut, FaultNetFlaky, FaultNetHealMidTx}

// The signals that arm a hold: a freeze that blocks the write (sigHold) or the open transaction
// (sigHoldInTx) until SIGCONT without stopping the process.
const (
	sigHold     = syscall.SIGWINCH
	sigHoldInTx = syscall.SIGPWR
)

func isNetFault(k FaultKind) bool { return slices.Contains(NetFaults, k) || isMinorityFault(k) }

// openNetFor opens the run's network layer if a configured fault needs it: forwarders for the
// brokers (the seeds and every broker the cluster advertises), PostgreSQL and Redis.
func (h *harness) openNetFor(ctx context.Context) error {
	if !slices.ContainsFunc(h.cfg.Faults, isNetFault) {
		return nil
	}
	if h.cfg.PostgresURL == "" || h.cfg.WorkerKafka.Enabled() {
		return errors.New("chaos: the network faults need PostgreSQL and a plaintext broker listener")
	}
	var brokers, db, others []int
	add := func(to *[]int, addr string) {
		if host, port, err := net.SplitHostPort(addr); err == nil && mapLoopback("x", addr) != addr {
			if p, err := strconv.Atoi(port); err == nil && host != "" {
				*to = append(*to, p)
			}
		}
	}
	for _, b := range h.cfg.Brokers {
		add(&brokers, b)
	}
	if md, err := h.adm.BrokerMetadata(ctx); err == nil {
		for _, b := range md.Brokers {
			add(&brokers, net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))))
		}
	}
	pc, err := pgconn.ParseConfig(h.cfg.PostgresURL)
	if err != nil {
		return err
	}
	add(&db, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
	for _, fb := range pc.Fallbacks { // a standby a failover promotes: the workers must reach it too
		add(&db, net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port))))
	}
	add(&others, h.cfg.RedisAddr)
	add(&others, h.cfg.RedisSink)
	if len(brokers) == 0 || len(db) == 0 {
		return errors.New("chaos: the network faults need the brokers and PostgreSQL on a loopback address")
	}
	if slices.ContainsFunc(h.cfg.Faults, isMinorityFault) {
		if why := MinoritySupported(); why != "" {
			return errors.New("chaos: " + why)
		}
	}
	n, err := openNet(slices.Concat(brokers, db, others))
	if err != nil {
		return err
	}
	n.mark.Store(slices.ContainsFunc(h.cfg.Faults, isMinorityFault))
	slices.Sort(brokers)
	slices.Sort(db)
	n.brokerPorts, n.dbPorts = slices.Compact(brokers), slices.Compact(db)
	h.net = n
	h.progress("network: bridge %s %s.0/24, forwarders on %s to ports %v", n.bridge, n.subnet, n.host, n.ports)
	return nil
}

// closeNet removes the run's network, after the workers stopped.
func (h *harness) closeNet() {
	if h.net != nil {
		h.net.close()
	}
}

// netEnv is the environment a worker needs in its namespace (none without one).
func (h *harness) netEnv() []string {
	if h.net == nil {
		return nil
	}
	return []string{NetHostEnv + "=" + h.net.host}
}

// netWrap returns the command that runs cmd's program as worker id in a namespace of its own
// (cmd itself without network faults).
func (h *harness) netWrap(id string, cmd []string) ([]string, error) {
	if h.net == nil {
		return cmd, nil
	}
	l, err := h.net.link(id)
	if err != nil {
		return nil, err
	}
	return append([]string{"ip", "netns", "exec", l.ns}, cmd...), nil
}

// netExited removes worker id's namespace once its process ended.
func (h *harness) netExited(id string) {
	if h.net != nil {
		h.net.unlink(id)
	}
}

func (h *harness) injectNet(ctx context.Context, f *Fault) {
	if h.net == nil {
		f.Detail = "no network layer"
		return
	}
	p := h.pickWriter(ctx)
	if p == nil {
		f.Detail = "no worker alive"
		return
	}
	f.Target = p.id
	l := h.net.linkOf(p.id)
	if l == nil {
		f.Detail = "worker has no namespace"
		return
	}
	switch f.Kind {
	case FaultNetBrokerCut:
		h.netBrokerCut(ctx, f, p, l, false)
	case FaultNetHealMidTx:
		h.netBrokerCut(ctx, f, p, l, true)
	case FaultNetDBCut:
		h.netDBCut(ctx, f, p, l)
	case FaultNetFlaky:
		h.netFlaky(ctx, f, l)
	}
}

// netBrokerCut holds p's next write (inTx: inside its transaction), cuts its link to the
// brokers, waits for the member's expiry and the takeover and releases the write: before the
// heal (net-broker-cut: the zombie writes while partitioned from the brokers) or after it
// (net-heal-mid-tx: the partition healed while the transaction was open).
func (h *harness) netBrokerCut(ctx context.Context, f *Fault, p *proc, l *netLink, inTx bool) {
	st := h.cfg.SessionTimeout
	sig, marker := sigHold, OutcomeFrozen
	if inTx {
		sig, marker = sigHoldInTx, OutcomeDelayed
	}
	since := time.Now().UnixMilli()
	held, ok := h.awaitNetHold(ctx, p, sig, marker, since)
	if !ok {
		f.Detail = "worker did not reach a write (no partitions?)"
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		return
	}
	released := false
	release := func() {
		if !released {
			released = true
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer release()
	cutAt := time.Now()
	if err := h.net.cut(l, h.net.brokerPorts); err != nil {
		f.Detail = err.Error()
		_ = h.net.heal(l)
		return
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			_ = h.net.heal(l)
		}
	}
	defer heal()
	// The broker's side: the member expires; the database's side: another member commits on
	// the held partition under a higher token.
	deadline := time.Now().Add(3*st + 30*time.Second)
	var expiredIn time.Duration
	taken := false
	for (expiredIn == 0 || !taken) && time.Now().Before(deadline) && ctx.Err() == nil {
		if expiredIn == 0 {
			if in, err := h.inGroup(ctx, p.id); err == nil && !in {
				expiredIn = time.Since(cutAt)
			}
		}
		taken = taken || h.takenOver(ctx, p.id, held)
		sleep(ctx, 200*time.Millisecond)
	}
	var toBroker int64
	var outcome string
	var rejoined bool
	if !inTx {
		release() // cut from the brokers, still reaching the database
		outcome = h.awaitZombie(ctx, p.id, since)
		toBroker, _ = h.net.dropped(l)
		heal()
	} else {
		toBroker, _ = h.net.dropped(l)
		heal()
		sleep(ctx, st) // the member's client reaches the brokers again, its transaction still open
		release()
		outcome = h.awaitZombie(ctx, p.id, since)
		rejoined = h.awaitInGroup(ctx, p.id, 3*st+20*time.Second)
	}
	f.End = time.Now()
	f.Detail = fmt.Sprintf("%s holding %s/%d at token %d.%d; broker ports %v cut: %d packets to the brokers dropped",
		marker, held.topic, held.part, held.era, held.epoch, h.net.brokerPorts, toBroker)
	if expiredIn > 0 {
		f.Detail += fmt.Sprintf(", member expired after %.1fs", expiredIn.Seconds())
	} else {
		f.Detail += ", member not seen to expire"
	}
	if taken {
		f.Detail += ", takeover seen"
	} else {
		f.Detail += ", no takeover seen"
	}
	if outcome != "" {
		f.Detail += ", zombie write " + outcome
		if !inTx {
			f.Detail += " (database reached while cut)"
		}
	} else {
		f.Detail += ", no zombie write logged"
	}
	f.Bit = toBroker > 0 && expiredIn > 0 && taken && outcome != ""
	if inTx {
		if rejoined {
			f.Detail += ", healed: member rejoined"
		} else {
			f.Detail += ", member did not rejoin"
		}
		f.Bit = f.Bit && rejoined
	}
	sleep(ctx, st)
}

// netDBCut cuts p's link to PostgreSQL for twice the session timeout, and on until the other
// workers committed while it was cut (at most dbCutMore longer: beside another fault, a broker
// restarted or the other workers frozen or killed, they may commit nothing for a while): the
// group must keep the member (its heartbeats pass) while it commits nothing (its packets to
// the database dropped) and the others do.
func (h *harness) netDBCut(ctx context.Context, f *Fault, p *proc, l *netLink) {
	st := h.cfg.SessionTimeout
	start := time.Now()
	if err := h.net.cut(l, h.net.dbPorts); err != nil {
		f.Detail = err.Error()
		_ = h.net.heal(l)
		return
	}
	// The cut is in place once cut returned: its tc commands take a while on a loaded machine,
	// and the worker commits meanwhile.
	cutAt := time.Now()
	// Counted before the heal, on the harness's own connection (not cut): what committed
	// while the link was down. A batch logged during the cut (at_ms is the worker's clock when
	// it wrote the row) may still commit after the heal, when TCP retransmits it: that is no
	// commit while cut. A batch logged just before the cut may commit just after it, its
	// packets already past the link: a grace period.
	from := cutAt.Add(500 * time.Millisecond).UnixMilli()
	var own, others int64
	commits := func(to time.Time) {
		own, others = -1, -1
		_ = h.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE worker = $1), count(*) FILTER (WHERE worker <> $1) FROM chaos_applied WHERE at_ms BETWEEN $2 AND $3`,
			p.id, from, to.UnixMilli()).Scan(&own, &others)
	}
	kept, looks := true, 0
	for end, bound := cutAt.Add(2*st), cutAt.Add(2*st+dbCutMore); ctx.Err() == nil; {
		in, err := h.inGroup(ctx, p.id)
		if err == nil {
			looks++
			kept = kept && in
		}
		if now := time.Now(); now.After(end) {
			commits(now)
			if !kept || own != 0 || (others > 0 && looks > 0) || now.After(bound) {
				break
			}
		}
		sleep(ctx, 250*time.Millisecond)
	}
	toDB, _ := h.net.dropped(l)
	healAt := time.Now()
	commits(healAt)
	_ = h.net.heal(l)
	f.End = healAt
	f.Detail = fmt.Sprintf("database ports %v cut for %.1fs (in place after %.1fs): %d packets to the database dropped; member kept in the group (%d looks): %v; commits while cut: %d by it, %d by the others",
		h.net.dbPorts, healAt.Sub(start).Seconds(), cutAt.Sub(start).Seconds(), toDB, looks, kept && looks > 0, own, others)
	f.Bit = toDB > 0 && kept && looks > 0 && own == 0 && others > 0
	sleep(ctx, st)
}

// dbCutMore is how much longer than twice the session timeout net-db-cut waits for the other
// workers to commit.
const dbCutMore = time.Minute

// netFlaky makes p's link flaky both ways (impair) for three session timeouts: proven by the
// packets delayed, lost and duplicated each way, as tc counted them.
func (h *harness) netFlaky(ctx context.Context, f *Fault, l *netLink) {
	st := h.cfg.SessionTimeout
	if err := h.net.impair(l); err != nil {
		f.Detail = err.Error()
		_ = h.net.heal(l)
		return
	}
	sleep(ctx, 3*st)
	from, to, dup := stats(l, true), stats(l, false), h.net.duplicated(l)
	_ = h.net.heal(l)
	f.End = time.Now()
	f.Detail = fmt.Sprintf("flaky link: from the worker %d packets delayed, %d lost, %d duplicated; to it %d delayed, %d lost",
		from.sent, from.dropped, dup, to.sent, to.dropped)
	f.Bit = from.sent > 0 && to.sent > 0 && from.dropped+to.dropped > 0 && dup > 0
	sleep(ctx, st)
}

type heldWrite struct {
	topic      string
	part       int32
	era, epoch int64
}

// awaitNetHold arms p's hold with sig and waits until it logs its held write (marker).
func (h *harness) awaitNetHold(ctx context.Context, p *proc, sig syscall.Signal, marker string, since int64) (heldWrite, bool) {
	_ = p.cmd.Process.Signal(sig)
	var w heldWrite
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		err := h.db.QueryRow(ctx, `SELECT topic, part, era, epoch FROM chaos_attempts WHERE worker = $1 AND outcome = $3 AND at_ms >= $2 ORDER BY id DESC LIMIT 1`,
			p.id, since, marker).Scan(&w.topic, &w.part, &w.era, &w.epoch)
		if err == nil {
			return w, true
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return w, false
}

// takenOver reports whether another worker committed on the held partition under a higher token.
func (h *harness) takenOver(ctx context.Context, id string, w heldWrite) bool {
	var n int64
	err := h.db.QueryRow(ctx, `SELECT count(*) FROM chaos_applied WHERE topic = $5 AND part = $1 AND worker <> $2 AND (era > $3 OR (era = $3 AND epoch > $4))`,
		w.part, id, w.era, w.epoch, w.topic).Scan(&n)
	return err == nil && n > 0
}

// awaitZombie waits for the held write's outcome, as the worker logged it.
func (h *harness) awaitZombie(ctx context.Context, id string, since int64) string {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var outcome, cause string
		err := h.db.QueryRow(ctx, `SELECT outcome, cause FROM chaos_attempts WHERE worker = $1 AND zombie AND at_ms >= $2 ORDER BY id DESC LIMIT 1`,
			id, since).Scan(&outcome, &cause)
		if err == nil {
			if cause != "" {
				outcome += " (" + cause + ")"
			}
			return outcome
		}
		sleep(ctx, 100*time.Millisecond)
	}
	return ""
}

// inGroup reports whether a member with client id id is in one of the run's groups, as the
// group coordinators see it.
func (h *harness) inGroup(ctx context.Context, id string) (bool, error) {
	groups := h.groups
	if len(groups) == 0 {
		groups = []string{h.cfg.Group}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if os.Getenv("BATON_GROUP_PROTOCOL") == "consumer" { // KIP-848 groups (protocol.go)
		described, err := h.adm.DescribeConsumerGroups(ctx, groups...)
		if err == nil {
			err = described.Error()
		}
		if err != nil {
			return false, err
		}
		for _, g := range described {
			for _, m := range g.Members {
				if m.ClientID == id {
					return true, nil
				}
			}
		}
		return false, nil
	}
	described, err := h.adm.DescribeGroups(ctx, groups...)
	if err != nil {
		return false, err
	}
	if err := described.Error(); err != nil {
		return false, err
	}
	for _, g := range described {
		for _, m := range g.Members {
			if m.ClientID == id {
				return true, nil
			}
		}
	}
	return false, nil
}

func (h *harness) awaitInGroup(ctx context.Context, id string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end) && ctx.Err() == nil; {
		if in, err := h.inGroup(ctx, id); err == nil && in {
			return true
		}
		sleep(ctx, 250*time.Millisecond)
	}
	return false
}

// The kernels the harness runs on may lack netem and tc's gact action (drop): the faults use
// what every kernel with tc has. A link's shaping is an htb root qdisc on both ends of its veth
// (the worker's end shapes what it sends, the host's end what it receives), a fast default class
// 1:1 and a class 1:2 that u32 filters send the fault's packets to, under a pfifo 2: that drops
// (a cut: limit 0) or queues behind a low rate (net-flaky).

// tcEnd runs tc for one end of l's veth: the host's (dev hostIf) or the worker's (in its namespace).
func tcEnd(l *netLink, worker bool, args ...string) error {
	if worker {
		return runCmd("ip", append([]string{"netns", "exec", l.ns, "tc"}, args...)...)
	}
	return runCmd("tc", args...)
}

func tcEndOut(l *netLink, worker bool, args ...string) string {
	if worker {
		return cmdOut("ip", append([]string{"netns", "exec", l.ns, "tc"}, args...)...)
	}
	return cmdOut("tc", args...)
}

func endDev(l *netLink, worker bool) string {
	if worker {
		return l.nsIf
	}
	return l.hostIf
}

// shape puts the htb tree on one end: class 1:2 at rate, its pfifo holding limit packets, and
// filters sending matches (u32 selectors) there.
func shape(l *netLink, worker bool, rate string, limit int, matches [][]string) error {
	dev := endDev(l, worker)
	cmds := [][]string{
		{"qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1", "r2q", "100000"},
		{"class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit"},
		{"class", "add", "dev", dev, "parent", "1:", "classid", "1:2", "htb", "rate", rate, "ceil", rate},
		{"qdisc", "add", "dev", dev, "parent", "1:2", "handle", "2:", "pfifo", "limit", strconv.Itoa(limit)},
	}
	for _, m := range matches {
		cmds = append(cmds, append(append([]string{"filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32"}, m...), "flowid", "1:2"))
	}
	for _, c := range cmds {
		if err := tcEnd(l, worker, c...); err != nil {
			return fmt.Errorf("chaos: network: %w", err)
		}
	}
	return nil
}

// cut drops every packet to and from ports on l's link: from the worker on its end (to those
// ports), to the worker on the host's end (from them).
func (n *netLayer) cut(l *netLink, ports []int) error {
	var from, to [][]string
	for _, p := range ports {
		ps := strconv.Itoa(p)
		from = append(from, []string{"match", "ip", "dport", ps, "0xffff"})
		to = append(to, []string{"match", "ip", "sport", ps, "0xffff"})
	}
	return errors.Join(shape(l, true, "10gbit", 0, from), shape(l, false, "10gbit", 0, to))
}

// heal removes a cut's or an impairment's qdiscs from both ends of l's veth.
func (n *netLayer) heal(l *netLink) error {
	var errs []error
	for _, worker := range []bool{true, false} {
		errs = append(errs, tcEnd(l, worker, "qdisc", "del", "dev", endDev(l, worker), "root"))
	}
	if err := runCmd("tc", "qdisc", "del", "dev", l.hostIf, "ingress"); err != nil && !strings.Contains(err.Error(), "Invalid handle") && !strings.Contains(err.Error(), "Cannot find") {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

var sentRE = regexp.MustCompile(`Sent (\d+) bytes (\d+) pkt \(dropped (\d+)`)

type qdiscStats struct{ sent, dropped int64 }

// stats reads the pfifo 2: of one end: packets it passed and dropped.
func stats(l *netLink, worker bool) qdiscStats {
	var s qdiscStats
	out := tcEndOut(l, worker, "-s", "qdisc", "show", "dev", endDev(l, worker))
	if i := strings.Index(out, "qdisc pfifo 2:"); i >= 0 {
		if m := sentRE.FindStringSubmatch(out[i:]); m != nil {
			s.sent, _ = strconv.ParseInt(m[2], 10, 64)
			s.dropped, _ = strconv.ParseInt(m[3], 10, 64)
		}
	}
	return s
}

// dropped returns how many packets a cut dropped from the worker and to it.
func (n *netLayer) dropped(l *netLink) (fromWorker, toWorker int64) {
	return stats(l, true).dropped, stats(l, false).dropped
}

// impair makes l's link flaky, both ways: every packet whose TCP sequence number has bit 8 set
// (about half, spread over each flow) queues behind a 512 kbit/s class holding at most 4 packets
// (delayed; reordered against the rest of its flow; dropped when that queue is full), and one
// packet from the worker in eight (sequence bits 8-10 set) is duplicated: mirrored into the
// bridge, which delivers the copy too.
func (n *netLayer) impair(l *netLink) error {
	slow := [][]string{{"match", "u32", "0x00000100", "0x00000100", "at", "24"}}
	if err := errors.Join(shape(l, true, "512kbit", 4, slow), shape(l, false, "512kbit", 4, slow)); err != nil {
		return err
	}
	for _, c := range [][]string{
		{"qdisc", "replace", "dev", l.hostIf, "handle", "ffff:", "ingress"},
		{"filter", "add", "dev", l.hostIf, "parent", "ffff:", "protocol", "ip", "prio", "1", "u32", "match", "u32", "0x00000700", "0x00000700", "at", "24",
			"action", "mirred", "ingress", "mirror", "dev", n.bridge},
	} {
		if err := runCmd("tc", c...); err != nil {
			return fmt.Errorf("chaos: network: %w", err)
		}
	}
	return nil
}

// duplicated returns how many packets from the worker impair duplicated.
func (n *netLayer) duplicated(l *netLink) int64 {
	var total int64
	for _, m := range sentRE.FindAllStringSubmatch(cmdOut("tc", "-s", "filter", "show", "dev", l.hostIf, "parent", "ffff:"), -1) {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		total += v
	}
	return total
}
