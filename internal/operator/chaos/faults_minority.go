package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The minority-coordinator fault: in a cluster of three brokers or more, the group
// coordinator's broker is cut from the other brokers and from some members, for longer than the
// brokers' session with the controller, while the harness's producer keeps writing. The cut
// broker still believes it coordinates the group and answers the members on its side; the
// majority fences it, moves its partitions' leadership and the coordinator elsewhere, and the
// members on the majority's side take the group over. A writer on the old coordinator's side
// then writes, a zombie that its coordinator never told: the fence must refuse it.
//
// The brokers, like every service, listen on 127.0.0.1, so the cut between them is made on the
// host's loopback with iptables, in a chain of the run's own (named like the network layer's
// links, so the sweep of dead runs finds it), jumped to from OUTPUT for lo only:
//
//   - the cut broker's new connections to the other brokers' ports, told from everyone else's by
//     the cgroup (v2) the broker process is moved into for the cut, and its connections open at
//     the cut, by their ports;
//   - every connection to its controller port, and to its broker port every connection but the
//     forwarders' (marked fwdMark): those of the other brokers and of the harness's own clients,
//     which stand on the majority's side.
//
// The members are cut on their veths (tc, faults_net.go): the writer on the old coordinator's
// side from the other brokers' ports, every other member from the cut broker's.
const (
	// Cut the group coordinator's broker from the other brokers and from every member but one
	// writer, which stays on its side with a write held, cut from the other brokers: the
	// majority fences the broker and moves the coordinator, the other members take the
	// writer's partitions over, then the held write is released, still cut: a zombie's write
	// to a coordinator that never saw it lose its partitions. The cut heals after.
	FaultNetMinorityCoordinator FaultKind = "net-minority-coordinator"
)

// MinorityFaults lists the kinds that partition the brokers themselves. They need what the
// network kinds need, a cluster of three brokers or more (Config.KafkaNodes), iptables and a
// cgroup v2 hierarchy.
//
// The target FaultNetMinorityCoordinator holds while it runs is a broker and the group: the
// coordinator's broker, cut, and every member of the run's group (all but one cut from that
// broker). No other fault may act on either meanwhile.
var MinorityFaults = []FaultKind{FaultNetMinorityCoordinator}

// fwdMark is the firewall mark (SO_MARK) of the forwarders' connections to the services, by
// which the broker cut lets the workers' connections through: the members are cut on their
// veths, member by member.
const fwdMark = 0x62746e

// MinoritySupported reports why the minority-coordinator fault cannot run here ("" if it can):
// it needs what the network faults need, iptables and a cgroup v2 hierarchy.
func MinoritySupported() string {
	if why := NetSupported(); why != "" {
		return why
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return "the minority-coordinator fault needs iptables"
	}
	if cgroup2Root() == "" {
		return "the minority-coordinator fault needs a cgroup v2 hierarchy (cgroup2 mounted)"
	}
	return ""
}

func isMinorityFault(k FaultKind) bool { return slices.Contains(MinorityFaults, k) }

// minorityCoordinator is FaultNetMinorityCoordinator.
func (h *harness) minorityCoordinator(ctx context.Context, f *Fault) {
	st := h.cfg.SessionTimeout
	if h.net == nil {
		f.Detail = "no network layer"
		return
	}
	// A fault beside it (a broker restarted, the coordinator moved) may have a broker out of
	// the cluster's view for a while: wait up to a minute for the coordinator and three brokers.
	var (
		before int32
		ports  map[int32]int
		xPort  int
	)
	for deadline := time.Now().Add(time.Minute); ; sleep(ctx, time.Second) {
		var err error
		before, err = h.findCoordinator(ctx)
		if err != nil || before < 0 {
			f.Detail = fmt.Sprintf("no group coordinator found: %v", err)
		} else if ports, err = h.brokerPorts(ctx); err != nil {
			f.Detail = err.Error()
		} else if p, ok := ports[before]; !ok || len(ports) < 3 {
			f.Detail = fmt.Sprintf("coordinator node %d not among the brokers %v (three or more needed)", before, ports)
		} else {
			xPort, f.Detail = p, ""
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
	}
	xPid, xListen := listener(xPort)
	if xPid == 0 {
		f.Detail = fmt.Sprintf("no process listens on node %d's port %d", before, xPort)
		return
	}
	var othersClient, othersAll []int
	var otherNodes []string
	for node, port := range ports {
		if node == before {
			continue
		}
		_, l := listener(port)
		if len(l) == 0 {
			l = []int{port}
		}
		othersClient = append(othersClient, port)
		othersAll = append(othersAll, l...)
		otherNodes = append(otherNodes, strconv.Itoa(int(node)))
	}
	slices.Sort(othersClient)
	slices.Sort(otherNodes)
	f.Target = fmt.Sprintf("kafka node %d and the group", before)

	// The writer left on the old coordinator's side, holding a write (its process runs on): a
	// writer that lost its partitions meanwhile, another.
	var p *proc
	var pl *netLink
	var held heldWrite
	var since int64
	ok := false
	for try := 0; try < 3 && !ok && ctx.Err() == nil; try++ {
		if p = h.pickWriter(ctx); p == nil {
			f.Detail = "no worker alive"
			return
		}
		if pl = h.net.linkOf(p.id); pl == nil {
			f.Detail = "worker has no namespace"
			return
		}
		since = time.Now().UnixMilli()
		if held, ok = h.awaitNetHold(ctx, p, sigHold, OutcomeFrozen, since); !ok {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	if !ok {
		f.Detail = "no worker reached a write (no partitions?)"
		return
	}
	f.Target += ", " + p.id
	released := false
	release := func() {
		if !released {
			released = true
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer release()

	xlog := h.nodeLog(ctx, before)
	cutAt := time.Now()
	c, err := h.net.cutBroker(before, xPid, xListen, xPort, othersAll)
	var links []*netLink // every member link cut
	healed := false
	heal := func() {
		if healed {
			return
		}
		healed = true
		for _, l := range links {
			_ = h.net.heal(l)
		}
		if c != nil {
			_ = c.heal()
		}
	}
	defer heal()
	if err != nil {
		f.Detail = err.Error()
		return
	}
	if err := h.net.cut(pl, othersClient); err != nil {
		f.Detail = err.Error()
		links = append(links, pl)
		return
	}
	links = append(links, pl)
	var majority, majorityMembers []string
	var majorityLinks []*netLink
	for _, q := range h.alive() {
		if q == p {
			continue
		}
		if ql := h.net.linkOf(q.id); ql != nil {
			links = append(links, ql)
			if err := h.net.cut(ql, []int{xPort}); err != nil {
				f.Detail = err.Error()
				return
			}
			majority = append(majority, q.id)
			majorityMembers = append(majorityMembers, q.memberPrefix())
			majorityLinks = append(majorityLinks, ql)
		}
	}

	// The old coordinator's side, as the cut broker itself answers it.
	probeCtx, stopProbe := context.WithCancel(ctx)
	old := &oldSideView{}
	var probes sync.WaitGroup
	probes.Add(1)
	go func() {
		defer probes.Done()
		h.probeOldSide(probeCtx, net.JoinHostPort("127.0.0.1", strconv.Itoa(xPort)), old)
	}()

	// The majority's side: the broker fenced (gone from the brokers the others list), the
	// offsets' leadership and the coordinator moved, another member committing on the held
	// partition under a higher token.
	deadline := cutAt.Add(3*st + 90*time.Second)
	var fencedIn, movedIn time.Duration
	after, leader := int32(-1), int32(-1)
	taken := false
	for (fencedIn == 0 || movedIn == 0 || leader < 0 || !taken) && time.Now().Before(deadline) && ctx.Err() == nil {
		if up, l, err := h.majorityView(ctx); err == nil {
			if fencedIn == 0 && !slices.Contains(up, before) {
				fencedIn = time.Since(cutAt)
			}
			if leader < 0 && l >= 0 && l != before {
				leader = l
			}
		}
		if movedIn == 0 {
			if n, err := h.findCoordinator(ctx); err == nil && n >= 0 && n != before {
				after, movedIn = n, time.Since(cutAt)
			}
		}
		taken = taken || h.takenOver(ctx, p.id, held)
		sleep(ctx, 250*time.Millisecond)
	}
	movedAt := cutAt.Add(movedIn)
	// Let the old side answer after the move, then release the held write, still cut.
	if movedIn > 0 {
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !old.answeredAfter(movedAt) && ctx.Err() == nil; {
			sleep(ctx, 100*time.Millisecond)
		}
	}
	release()
	outcome := h.awaitZombie(ctx, p.id, since)
	fromX, toCtrl, toBroker := c.drops()
	writerDropped, _ := h.net.dropped(pl)
	var majorityDropped int64
	for _, l := range majorityLinks {
		d, _ := h.net.dropped(l)
		majorityDropped += d
	}
	stopProbe()
	probes.Wait()
	healAt := time.Now()
	named, expired, minority := xlog.memberLines(before, p.memberPrefix(), majorityMembers)
	heal()
	// The broker back: unfenced, listed by the others again.
	var backIn time.Duration
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end) && ctx.Err() == nil; {
		if up, _, err := h.majorityView(ctx); err == nil && slices.Contains(up, before) {
			backIn = time.Since(healAt)
			break
		}
		sleep(ctx, 500*time.Millisecond)
	}
	f.End = time.Now()

	looks, answers, lastAnswer := old.get()
	ev := []string{
		fmt.Sprintf("%s holding %s/%d at token %d.%d", OutcomeFrozen, held.topic, held.part, held.era, held.epoch),
		fmt.Sprintf("coordinator node %d (pid %d, ports %v) cut from nodes %s for %.1fs: %d packets from it to the other brokers dropped, %d to its controller port, %d to its broker port from the majority's side",
			before, xPid, xListen, strings.Join(otherNodes, ","), healAt.Sub(cutAt).Seconds(), fromX, toCtrl, toBroker),
		fmt.Sprintf("%s left on its side (cut from ports %v: %d packets dropped), %s cut from it (port %d: %d packets dropped)",
			p.id, othersClient, writerDropped, strings.Join(majority, ","), xPort, majorityDropped),
	}
	if fencedIn > 0 {
		ev = append(ev, fmt.Sprintf("majority: node %d fenced after %.1fs", before, fencedIn.Seconds()))
	} else {
		ev = append(ev, fmt.Sprintf("majority: node %d never seen fenced", before))
	}
	if movedIn > 0 {
		ev = append(ev, fmt.Sprintf("coordinator moved to node %d after %.1fs (offsets leader %d)", after, movedIn.Seconds(), leader))
	} else {
		ev = append(ev, "coordinator not seen to move")
	}
	if taken {
		ev = append(ev, "takeover seen")
	} else {
		ev = append(ev, "no takeover seen")
	}
	answeredOld := movedIn > 0 && lastAnswer.After(movedAt)
	ev = append(ev, fmt.Sprintf("old side: node %d answered for the group %d of %d looks, last at %s (coordinator moved at %s; %s)",
		before, answers, looks, stampOf(lastAnswer), stampOf(movedAt), old.lastState()))
	ev = append(ev, fmt.Sprintf("node %d's log while cut: %d lines naming %s's member, %d expiring %s's", before, named, p.id, expired, strings.Join(majority, ",")))
	if minority != "" {
		ev = append(ev, "last: "+minority)
	}
	if outcome != "" {
		ev = append(ev, "zombie write "+outcome+" (released while cut)")
	} else {
		ev = append(ev, "no zombie write logged")
	}
	if backIn > 0 {
		ev = append(ev, fmt.Sprintf("healed: node %d back after %.1fs", before, backIn.Seconds()))
	} else {
		ev = append(ev, fmt.Sprintf("node %d not back", before))
	}
	f.Detail = strings.Join(ev, "; ")
	f.Bit = fromX > 0 && writerDropped > 0 && majorityDropped > 0 && fencedIn > 0 && movedIn > 0 && taken &&
		answeredOld && named > 0 && outcome != "" && backIn > 0
	sleep(ctx, st)
}

func stampOf(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format(stamp)
}

// freshAdmin returns an admin client of its own, with its own connections: the harness's
// connections to a cut broker may stay stalled in TCP's backoff for minutes after the heal.
func (h *harness) freshAdmin() (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.cfg.Brokers...), kgo.RequestRetries(2), kgo.DialTimeout(time.Second)}, h.cfg.Kafka...)...)
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// brokerPorts returns the brokers' ports on the loopback by node id, as the cluster lists them.
func (h *harness) brokerPorts(ctx context.Context) (map[int32]int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	adm, done, err := h.freshAdmin()
	if err != nil {
		return nil, err
	}
	defer done()
	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		return nil, err
	}
	out := map[int32]int{}
	for _, b := range md.Brokers {
		if ip := net.ParseIP(b.Host); b.Host == "localhost" || ip != nil && ip.IsLoopback() {
			out[b.NodeID] = int(b.Port)
		}
	}
	return out, nil
}

// majorityView returns the node ids the cluster lists (a KRaft cluster lists its unfenced
// brokers) and the leader of __consumer_offsets' partition holding the group (-1 if unknown).
func (h *harness) majorityView(ctx context.Context) ([]int32, int32, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	adm, done, err := h.freshAdmin()
	if err != nil {
		return nil, -1, err
	}
	defer done()
	const offsetsTopic = "__consumer_offsets"
	md, err := adm.Metadata(ctx, offsetsTopic)
	if err != nil {
		return nil, -1, err
	}
	leader := int32(-1)
	if td, ok := md.Topics[offsetsTopic]; ok && td.Err == nil && len(td.Partitions) > 0 {
		if pd, ok := td.Partitions[groupPartition(h.runGroups()[0], len(td.Partitions))]; ok && pd.Err == nil {
			leader = pd.Leader
		}
	}
	return md.Brokers.NodeIDs(), leader, nil
}

// findCoordinator returns the node id of the workers' group coordinator, as the harness's side
// finds it.
func (h *harness) findCoordinator(ctx context.Context) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	adm, done, err := h.freshAdmin()
	if err != nil {
		return -1, err
	}
	defer done()
	g := h.runGroups()[0]
	r, ok := adm.FindGroupCoordinators(ctx, g)[g]
	if !ok || r.Err != nil {
		return -1, fmt.Errorf("find coordinator: %v", r.Err)
	}
	return r.NodeID, nil
}

// nodeLogAt is one broker's log, from where it was when a fault began.
type nodeLogAt struct {
	path string
	off  int64
}

// nodeLog positions node's log (kafka.sh logfile N) at its end.
func (h *harness) nodeLog(ctx context.Context, node int32) *nodeLogAt {
	out, err := h.scriptOutput(ctx, "kafka.sh", "logfile", strconv.Itoa(int(node)))
	if err != nil {
		return nil
	}
	l := &nodeLogAt{path: strings.TrimSpace(out)}
	if fi, err := os.Stat(l.path); err == nil {
		l.off = fi.Size()
	}
	return l
}

// memberLines reads the group coordinator's lines of node's log since the fault began: how many
// name a member whose id starts with member + "-" (a worker's memberPrefix), how many expire a
// member of the others', and the last group it stabilized.
func (l *nodeLogAt) memberLines(node int32, member string, others []string) (named, expired int, stabilized string) {
	if l == nil {
		return 0, 0, ""
	}
	f, err := os.Open(l.path)
	if err != nil {
		return 0, 0, ""
	}
	defer f.Close()
	if _, err := f.Seek(l.off, 0); err != nil {
		return 0, 0, ""
	}
	prefix := fmt.Sprintf("[GroupCoordinator id=%d ", node)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, prefix) {
			continue
		}
		if strings.Contains(line, " "+member+"-") {
			named++
		}
		for _, o := range others {
			if strings.Contains(line, " "+o+"-") && strings.Contains(line, "expir") {
				expired++
			}
		}
		if i := strings.Index(line, "Stabilized group"); i >= 0 {
			stabilized = strings.TrimSuffix(strings.TrimSpace(line[i:]), " (org.apache.kafka.coordinator.group.GroupMetadataManager)")
		}
	}
	return named, expired, stabilized
}

// memberPrefix is how the coordinator's member ids for worker p begin: Kafka names a static
// member's id after its group.instance.id (a replacement's after its predecessor's), a dynamic
// one's after its client id (the worker's id), then "-" and a UUID.
func (p *proc) memberPrefix() string {
	if p.instance != "" {
		return p.instance
	}
	return p.id
}

// runGroups returns the groups the workers join.
func (h *harness) runGroups() []string {
	if len(h.groups) == 0 {
		return []string{h.cfg.Group}
	}
	return h.groups
}

// oldSideView is what the cut broker answers about the group.
type oldSideView struct {
	mu             sync.Mutex
	looks, answers int
	last           time.Time // its last answer as the group's coordinator
	state          string
}

func (o *oldSideView) get() (looks, answers int, last time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.looks, o.answers, o.last
}

func (o *oldSideView) lastState() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.state == "" {
		return "no answer"
	}
	return "last: " + o.state
}

// answeredAfter reports whether the broker last answered as the group's coordinator after t.
func (o *oldSideView) answeredAfter(t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last.After(t)
}

// probeOldSide asks the cut broker itself (through the forwarders' mark, which the cut lets
// pass) for the group every 250 ms and notes when it answers as the group's coordinator (not
// NOT_COORDINATOR). Its members are not asked: a coordinator answers a description from what
// its log committed, which a cut coordinator's writes never reach.
func (h *harness) probeOldSide(ctx context.Context, addr string, o *oldSideView) {
	d := &net.Dialer{Timeout: time.Second, Control: markControl}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.RequestRetries(0),
		kgo.RetryTimeout(time.Second), kgo.Dialer(d.DialContext)}, h.cfg.Kafka...)...)
	if err != nil {
		return
	}
	defer cl.Close()
	seeds := cl.SeedBrokers()
	if len(seeds) == 0 {
		return
	}
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Groups = h.runGroups()
		resp, err := seeds[0].Request(rctx, req)
		cancel()
		o.mu.Lock()
		o.looks++
		if err == nil {
			for _, g := range resp.(*kmsg.DescribeGroupsResponse).Groups {
				if e := kerr.ErrorForCode(g.ErrorCode); e != nil {
					o.state = g.Group + ": " + e.Error()
					continue
				}
				o.answers++
				o.last = time.Now()
				o.state = fmt.Sprintf("%s %s", g.Group, g.State)
			}
		}
		o.mu.Unlock()
		sleep(ctx, 250*time.Millisecond)
	}
}

// markControl sets fwdMark on a socket before it connects.
func markControl(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, fwdMark)
	})
	return errors.Join(err, serr)
}

// brokerCut is one broker's cut from the others: an iptables chain and a cgroup, both named
// after the run (prefix + "m" + node id).
type brokerCut struct {
	name string
	pid  int
	home string // the broker's cgroup.procs before the cut
}

// cutBroker cuts the broker process pid, listening on ports own (its broker port brokerPort among
// them), from the other brokers' ports others.
func (n *netLayer) cutBroker(node int32, pid int, own []int, brokerPort int, others []int) (*brokerCut, error) {
	root := cgroup2Root()
	if root == "" {
		return nil, errors.New("chaos: network: no cgroup v2 hierarchy")
	}
	if pid <= 1 || pid == os.Getpid() {
		return nil, fmt.Errorf("chaos: network: pid %d is no broker of its own", pid)
	}
	c := &brokerCut{name: fmt.Sprintf("%sm%d", n.prefix, node), pid: pid}
	// The broker's new sockets are made in the cut's cgroup.
	home := "/"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(line, "0::"); ok {
				home = p
			}
		}
	}
	c.home = filepath.Join(root, home, "cgroup.procs")
	dir := filepath.Join(root, c.name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: network: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		_ = c.heal()
		return nil, fmt.Errorf("chaos: network: move broker %d into %s: %w", pid, dir, err)
	}
	ctrl := slices.DeleteFunc(slices.Clone(own), func(p int) bool { return p == brokerPort })
	rules := [][]string{
		{"-p", "tcp", "-m", "cgroup", "--path", "/" + c.name, "-m", "multiport", "--dports", joinPorts(others), "-m", "comment", "--comment", "from-broker"},
		{"-p", "tcp", "--dport", strconv.Itoa(brokerPort), "-m", "mark", "!", "--mark", strconv.Itoa(fwdMark), "-m", "comment", "--comment", "to-broker"},
	}
	if len(ctrl) > 0 {
		rules = append(rules, []string{"-p", "tcp", "-m", "multiport", "--dports", joinPorts(ctrl), "-m", "comment", "--comment", "to-controller"})
	}
	// Its connections to the other brokers open before the move, by their ports.
	for _, s := range sockets(pid, false) {
		if slices.Contains(others, s.peerPort) {
			rules = append(rules, []string{"-p", "tcp", "-s", s.local, "--sport", strconv.Itoa(s.localPort), "-d", s.peer, "--dport", strconv.Itoa(s.peerPort), "-m", "comment", "--comment", "from-broker"})
		}
	}
	if err := iptables("-N", c.name); err != nil {
		_ = c.heal()
		return nil, err
	}
	for _, r := range rules {
		if err := iptables(append(append([]string{"-A", c.name}, r...), "-j", "DROP")...); err != nil {
			_ = c.heal()
			return nil, err
		}
	}
	if err := iptables("-I", "OUTPUT", "-o", "lo", "-m", "comment", "--comment", c.name, "-j", c.name); err != nil {
		_ = c.heal()
		return nil, err
	}
	return c, nil
}

// drops returns the packets the cut dropped: from the broker to the others, to its controller
// port, to its broker port.
func (c *brokerCut) drops() (from, toCtrl, toBroker int64) {
	for _, line := range strings.Split(cmdOut("iptables", "-w", "-L", c.name, "-v", "-x", "-n"), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(line, "/* from-broker */"):
			from += n
		case strings.Contains(line, "/* to-controller */"):
			toCtrl += n
		case strings.Contains(line, "/* to-broker */"):
			toBroker += n
		}
	}
	return from, toCtrl, toBroker
}

// heal removes the cut: the chain, and the broker back in its cgroup.
func (c *brokerCut) heal() error {
	var errs []error
	if c.pid > 0 && syscall.Kill(c.pid, 0) == nil {
		if err := os.WriteFile(c.home, []byte(strconv.Itoa(c.pid)), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	removeCut(c.name)
	if slices.Contains(cutNames(), c.name) {
		errs = append(errs, fmt.Errorf("chaos: network: %s not removed", c.name))
	}
	return errors.Join(errs...)
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

func iptables(args ...string) error { return runCmd("iptables", append([]string{"-w"}, args...)...) }

// cgroup2Root returns where the cgroup v2 hierarchy is mounted ("" if it is not).
func cgroup2Root() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if fs := strings.Fields(pre); ok && strings.HasPrefix(post, "cgroup2 ") && len(fs) > 4 {
			return fs[4]
		}
	}
	return ""
}

// cutNames lists the iptables chains and cgroups named by a broker cut.
func cutNames() []string {
	var out []string
	for _, line := range strings.Split(cmdOut("iptables", "-w", "-S"), "\n") {
		if name, ok := strings.CutPrefix(line, "-N "); ok && netNamePattern.MatchString(name) {
			out = append(out, name)
		}
	}
	if root := cgroup2Root(); root != "" {
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if e.IsDir() && netNamePattern.MatchString(e.Name()) && !slices.Contains(out, e.Name()) {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// removeCut removes the chain named name (and the OUTPUT rules jumping to it) and the cgroup
// named name, moving what it holds back to the root cgroup.
func removeCut(name string) {
	for _, line := range strings.Split(cmdOut("iptables", "-w", "-S", "OUTPUT"), "\n") {
		if rule, ok := strings.CutPrefix(line, "-A OUTPUT "); ok && strings.HasSuffix(rule, "-j "+name) {
			_ = iptables(append([]string{"-D", "OUTPUT"}, strings.Fields(rule)...)...)
		}
	}
	_ = iptables("-F", name)
	_ = iptables("-X", name)
	root := cgroup2Root()
	if root == "" {
		return
	}
	dir := filepath.Join(root, name)
	if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(pid), 0o644)
		}
	}
	_ = os.Remove(dir)
}

// A socket of a process, as ss lists it.
type socket struct {
	local, peer         string
	localPort, peerPort int
}

var ssPidRE = regexp.MustCompile(`pid=(\d+),`)

// sockets lists pid's TCP sockets: listening ones (listen) or established ones.
func sockets(pid int, listen bool) []socket {
	args := []string{"-H", "-t", "-n", "-p", "state", "established"}
	if listen {
		args = []string{"-H", "-t", "-n", "-p", "-l"}
	}
	var out []socket
	for _, line := range strings.Split(cmdOut("ss", args...), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[len(f)-1], "users:") {
			continue
		}
		owned := false
		for _, m := range ssPidRE.FindAllStringSubmatch(f[len(f)-1], -1) {
			owned = owned || m[1] == strconv.Itoa(pid)
		}
		if !owned {
			continue
		}
		lh, lp, err1 := net.SplitHostPort(f[len(f)-3])
		ph, pp, err2 := net.SplitHostPort(f[len(f)-2])
		if err1 != nil || err2 != nil {
			continue
		}
		s := socket{local: v4(lh), peer: v4(ph)}
		s.localPort, _ = strconv.Atoi(lp)
		s.peerPort, _ = strconv.Atoi(pp)
		out = append(out, s)
	}
	return out
}

// v4 writes an IPv4-mapped address (a Java socket's) as IPv4, which iptables matches.
func v4(host string) string {
	if ip := net.ParseIP(host); ip != nil && ip.To4() != nil {
		return ip.To4().String()
	}
	return host
}

// listener returns the process listening on port on the loopback (not the forwarders, on the
// run's bridge) and every port it listens on.
func listener(port int) (int, []int) {
	for _, line := range strings.Split(cmdOut("ss", "-H", "-t", "-n", "-p", "-l", "sport", "=", ":"+strconv.Itoa(port)), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		host, _, err := net.SplitHostPort(f[len(f)-3])
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			continue
		}
		if m := ssPidRE.FindStringSubmatch(line); m != nil {
			pid, _ := strconv.Atoi(m[1])
			if pid == os.Getpid() {
				continue
			}
			var ports []int
			for _, s := range sockets(pid, true) {
				ports = append(ports, s.localPort)
			}
			slices.Sort(ports)
			return pid, slices.Compact(ports)
		}
	}
	return 0, nil
}
