package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The network faults (faults_net.go) need links the harness can cut, so a run with one of them
// puts every worker process in a network namespace of its own:
//
//	worker (netns bnP_R-wN) ── veth bnP_R-nN | bnP_R-hN ── bridge bnP_R-b (10.A.B.1/24) ── forwarder ── 127.0.0.1:port
//
// The services (the brokers, PostgreSQL, Redis) listen on, and the brokers advertise, 127.0.0.1,
// which inside a namespace is the namespace's own loopback. The harness does not reconfigure
// them (they are shared with the harness's own clients and its restart faults): it runs a TCP
// forwarder per service port on the bridge's address, 10.A.B.1:port → 127.0.0.1:port, and tells
// each worker (NetHostEnv) that the host's loopback is at 10.A.B.1; the worker dials every
// loopback address there (the brokers' advertised ones included: a kgo.Dialer, pgconn's
// DialFunc, the Redis address). Every byte between a worker and a service so crosses the
// worker's veth, where the faults act with tc on both of its ends (faults_net.go).
//
// Every name carries the run's prefix, "bn" + the harness's pid (base 36) + "_" + a run number:
// at the start of a run, whatever carries the prefix of a process no longer alive (a run that
// was killed) is removed; at its end, and on SIGINT or SIGTERM, everything the run created is.
// On a signal the removal comes first, then the signal is delivered again: a test binary (no
// handler of its own) dies of it as before; a program that handles it (baton chaos) winds its
// run down with the workers already cut off from the services.

// NetHostEnv is the environment variable through which a worker in a network namespace learns
// the address at which it reaches the host's loopback services.
const NetHostEnv = "BATON_CHAOS_NET_HOST"

var netRuns atomic.Int64

// netNamePattern matches the names the network layer gives: the owner's pid in base 36, the run.
var netNamePattern = regexp.MustCompile(`^bn([0-9a-z]+)_([0-9a-z]+)-`)

// netLayer is one run's network: a bridge, a namespace and veth pair per worker, forwarders.
type netLayer struct {
	prefix string // "bn<pid>_<run>-"
	bridge string
	host   string // the bridge's address: the workers' view of the host's loopback
	subnet string // 10.A.B
	ports  []int  // forwarded
	// The ports the faults cut: the brokers', the database's.
	brokerPorts, dbPorts []int

	mu       sync.Mutex
	links    map[string]*netLink // by worker id
	lns      []net.Listener
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
	sigs     chan os.Signal
	sigDone  chan struct{}
	bySignal atomic.Bool // close runs on the signal watcher
	// mark makes the forwarders mark their connections to the services (fwdMark), which a
	// broker cut lets through (faults_minority.go).
	mark atomic.Bool
}

// netLink is one worker's namespace and its veth pair.
type netLink struct {
	ns, hostIf, nsIf, addr string
}

// NetSupported reports why network namespaces cannot be used here ("" if they can): the
// network faults need root, ip and tc.
func NetSupported() string {
	if os.Geteuid() != 0 {
		return "network faults need root (network namespaces, veth, tc)"
	}
	for _, bin := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return "network faults need " + bin + " (iproute2)"
		}
	}
	name := fmt.Sprintf("bn%s_probe-", strconv.FormatInt(int64(os.Getpid()), 36))
	if err := ipCmd("netns", "add", name+"p"); err != nil {
		return "no network namespace support: " + err.Error()
	}
	_ = ipCmd("netns", "del", name+"p")
	return ""
}

func ipCmd(args ...string) error { return runCmd("ip", args...) }

func runCmd(bin string, args ...string) error {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func cmdOut(bin string, args ...string) string {
	out, _ := exec.Command(bin, args...).Output()
	return string(out)
}

// openNet creates the run's bridge and forwarders to ports on 127.0.0.1, after removing the
// leftovers of dead runs.
func openNet(ports []int) (*netLayer, error) {
	if why := NetSupported(); why != "" {
		return nil, errors.New("chaos: " + why)
	}
	SweepNet()
	pid := os.Getpid()
	n := &netLayer{
		prefix: fmt.Sprintf("bn%s_%s-", strconv.FormatInt(int64(pid), 36), strconv.FormatInt(netRuns.Add(1), 36)),
		links:  map[string]*netLink{}, conns: map[net.Conn]struct{}{},
		sigs: make(chan os.Signal, 1), sigDone: make(chan struct{}),
	}
	n.bridge = n.prefix + "b"
	slices.Sort(ports)
	n.ports = slices.Compact(ports)
	// Cleanup on interrupt: remove what the run created, then deliver the signal again, to the
	// program's own handlers if it has any, or to its default action (the process ends).
	signal.Notify(n.sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		defer close(n.sigDone)
		sig := <-n.sigs
		if sig == nil {
			return // closed
		}
		n.bySignal.Store(true)
		n.close()
		_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
	}()
	if err := n.setup(pid); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

func (n *netLayer) setup(pid int) error {
	routes := cmdOut("ip", "-4", "route", "show")
	for i := 0; i < 256*40; i++ {
		v := (pid + i) % (256 * 40)
		s := fmt.Sprintf("10.%d.%d", 200+v/256, v%256)
		if !strings.Contains(routes, s+".") {
			n.subnet = s
			break
		}
	}
	if n.subnet == "" {
		return errors.New("chaos: no free 10.200-239.x.0/24 subnet for the run's bridge")
	}
	n.host = n.subnet + ".1"
	for _, args := range [][]string{
		{"link", "add", n.bridge, "type", "bridge"},
		{"addr", "add", n.host + "/24", "dev", n.bridge},
		{"link", "set", n.bridge, "up"},
	} {
		if err := ipCmd(args...); err != nil {
			return fmt.Errorf("chaos: network: %w", err)
		}
	}
	// The bridge's address takes a moment to become bindable (duplicate address detection is
	// IPv6's only; IPv4 binds at once).
	for _, port := range n.ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(n.host, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("chaos: network: forwarder: %w", err)
		}
		n.lns = append(n.lns, ln)
		n.wg.Add(1)
		go n.forward(ln, port)
	}
	return nil
}

// forward accepts connections on ln and joins each to 127.0.0.1:port.
func (n *netLayer) forward(ln net.Listener, port int) {
	defer n.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			d := net.Dialer{Timeout: 10 * time.Second}
			if n.mark.Load() {
				d.Control = markControl
			}
			up, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				_ = c.Close()
				return
			}
			if !n.track(c, up) {
				return
			}
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(up, c)
			go pipe(c, up)
			<-done
			<-done
			n.untrack(c, up)
		}()
	}
}

func (n *netLayer) track(cs ...net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		n.conns[c] = struct{}{}
	}
	return true
}

func (n *netLayer) untrack(cs ...net.Conn) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
		delete(n.conns, c)
	}
}

// link creates worker id's namespace and joins it to the bridge.
func (n *netLayer) link(id string) (*netLink, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, errors.New("chaos: network closed")
	}
	num := strings.TrimPrefix(id, "w")
	i, _ := strconv.Atoi(num)
	l := &netLink{ns: n.prefix + "w" + num, hostIf: n.prefix + "h" + num, nsIf: n.prefix + "n" + num,
		addr: fmt.Sprintf("%s.%d", n.subnet, 2+i%250)}
	n.links[id] = l
	n.mu.Unlock()
	for _, args := range [][]string{
		{"netns", "add", l.ns},
		{"link", "add", l.hostIf, "type", "veth", "peer", "name", l.nsIf, "netns", l.ns},
		{"link", "set", l.hostIf, "master", n.bridge},
		{"link", "set", l.hostIf, "up"},
		{"-n", l.ns, "addr", "add", l.addr + "/24", "dev", l.nsIf},
		{"-n", l.ns, "link", "set", l.nsIf, "up"},
		{"-n", l.ns, "link", "set", "lo", "up"},
	} {
		if err := ipCmd(args...); err != nil {
			return nil, fmt.Errorf("chaos: network: %w", err)
		}
	}
	return l, nil
}

func (n *netLayer) linkOf(id string) *netLink {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.links[id]
}

// unlink removes worker id's namespace and veth pair (its process has exited).
func (n *netLayer) unlink(id string) {
	n.mu.Lock()
	l := n.links[id]
	delete(n.links, id)
	n.mu.Unlock()
	if l != nil {
		_ = ipCmd("link", "del", l.hostIf)
		_ = ipCmd("netns", "del", l.ns)
	}
}

// close removes everything the run created and stops the forwarders. It may be called again.
func (n *netLayer) close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	lns, links := n.lns, n.links
	n.links = map[string]*netLink{}
	for c := range n.conns {
		_ = c.Close()
	}
	n.mu.Unlock()
	for _, ln := range lns {
		_ = ln.Close()
	}
	for _, l := range links {
		_ = ipCmd("link", "del", l.hostIf)
		_ = ipCmd("netns", "del", l.ns)
	}
	_ = ipCmd("link", "del", n.bridge)
	removeNet(n.prefix)
	n.wg.Wait()
	signal.Stop(n.sigs)
	if !n.bySignal.Load() {
		n.sigs <- nil // the watcher is waiting: it ends
		<-n.sigDone
	}
}

// removeNet removes every namespace, link, broker cut's iptables chain and cgroup whose name
// starts with prefix.
func removeNet(prefix string) {
	for _, name := range netNames() {
		if strings.HasPrefix(name, prefix) {
			removeNetName(name)
		}
	}
	for _, name := range cutNames() {
		if strings.HasPrefix(name, prefix) {
			removeCut(name)
		}
	}
}

func removeNetName(name string) {
	if strings.Contains(name, "-w") {
		_ = ipCmd("netns", "del", name)
	} else {
		_ = ipCmd("link", "del", name)
	}
}

// netNames lists the namespaces and links named by a network layer.
func netNames() []string {
	var out []string
	for _, line := range strings.Split(cmdOut("ip", "netns", "list"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && netNamePattern.MatchString(f[0]) {
			out = append(out, f[0])
		}
	}
	for _, line := range strings.Split(cmdOut("ip", "-o", "link", "show"), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if netNamePattern.MatchString(name) {
			out = append(out, name)
		}
	}
	return out
}

// SweepNet removes the namespaces, veths, bridges and broker cuts (iptables chains, cgroups)
// left behind by network layers whose process is no longer alive (a run killed before it could
// clean up).
func SweepNet() {
	dead := func(name string) bool {
		m := netNamePattern.FindStringSubmatch(name)
		pid, err := strconv.ParseInt(m[1], 36, 64)
		return err == nil && pid != int64(os.Getpid()) && syscall.Kill(int(pid), 0) == syscall.ESRCH
	}
	for _, name := range netNames() {
		if dead(name) {
			removeNetName(name)
		}
	}
	for _, name := range cutNames() {
		if dead(name) {
			removeCut(name)
		}
	}
}

// NetLeftovers lists what network layers of this process left behind: namespaces, links,
// qdiscs on them, broker cuts' iptables chains and cgroups (empty after every run ended). A
// test's proof that cleanup happened.
func NetLeftovers() []string {
	own := fmt.Sprintf("bn%s_", strconv.FormatInt(int64(os.Getpid()), 36))
	var out []string
	for _, name := range netNames() {
		if strings.HasPrefix(name, own) && !strings.HasSuffix(name, "_probe-p") {
			out = append(out, name)
		}
	}
	for _, line := range strings.Split(cmdOut("tc", "qdisc", "show"), "\n") {
		if strings.Contains(line, " dev "+own) {
			out = append(out, "qdisc: "+strings.TrimSpace(line))
		}
	}
	for _, name := range cutNames() {
		if strings.HasPrefix(name, own) {
			out = append(out, "broker cut: "+name)
		}
	}
	return out
}

// loopbackDialer returns a dialer that dials every loopback address at host instead (the
// worker's view of the host through its namespace's veth), and every other address as given.
func loopbackDialer(host string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, mapLoopback(host, addr))
	}
}

// mapLoopback replaces addr's host by host if it is a loopback address.
func mapLoopback(host, addr string) string {
	if host == "" {
		return addr
	}
	h, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(h); h == "localhost" || ip != nil && ip.IsLoopback() {
		return net.JoinHostPort(host, port)
	}
	return addr
}

// mapLoopbackURL is mapLoopback for the hosts of a PostgreSQL URL given to a worker's
// application, which may open connections of its own: every host of the URL's host list,
// with or without a port. A keyword/value connection string is returned unchanged (the
// harness passes URLs: it appends search_path as a query parameter).
func mapLoopbackURL(host, raw string) string {
	u, err := url.Parse(raw)
	if host == "" || err != nil || u.Host == "" {
		return raw
	}
	hosts := strings.Split(u.Host, ",")
	for i, h := range hosts {
		if _, _, err := net.SplitHostPort(h); err == nil {
			hosts[i] = mapLoopback(host, h)
		} else if name := strings.Trim(h, "[]"); name == "localhost" || net.ParseIP(name) != nil && net.ParseIP(name).IsLoopback() {
			hosts[i] = host
		}
	}
	u.Host = strings.Join(hosts, ",")
	return u.String()
}
