package chaos

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// netChildEnv makes the test binary a process that opens a network layer with one worker's
// namespace, says "ready" and waits to be signalled.
const netChildEnv = "BATON_CHAOS_NETNS_CHILD"

func TestNetLayerChild(t *testing.T) {
	if os.Getenv(netChildEnv) == "" {
		t.Skip("the child process of TestNetLayerRemovedOnSignalOrSwept")
	}
	n, err := openNet([]int{9})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if _, err := n.link("w1"); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if err := n.cut(n.linkOf("w1"), []int{9}); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	// Where the minority-coordinator fault can run, a broker cut too, of a stand-in process.
	stand := 0
	if MinoritySupported() == "" {
		sleeper := exec.Command("sleep", "300")
		if err := sleeper.Start(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		stand = sleeper.Process.Pid
		if _, err := n.cutBroker(1, stand, []int{10}, 9, []int{11}); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
	}
	fmt.Println("ready", stand)
	select {}
}

// netChild starts TestNetLayerChild and returns it once its network is up, with the prefix of
// its names (and, where a broker cut was made, the stand-in broker's pid, killed at the end of t).
func netChild(t *testing.T) (*exec.Cmd, string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestNetLayerChild$")
	cmd.Env = append(os.Environ(), netChildEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child: %q", line)
	}
	stand, _ := strconv.Atoi(f[1])
	if stand > 0 {
		t.Cleanup(func() { _ = syscall.Kill(stand, syscall.SIGKILL) })
	}
	return cmd, fmt.Sprintf("bn%s_", strconv.FormatInt(int64(cmd.Process.Pid), 36)), stand
}

// cgroupOf returns pid's cgroup v2 path.
func cgroupOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p
		}
	}
	return ""
}

// cutsOf lists the broker cuts' chains and cgroups whose names start with prefix.
func cutsOf(prefix string) []string {
	var out []string
	for _, name := range cutNames() {
		if strings.HasPrefix(name, prefix) {
			out = append(out, "broker cut: "+name)
		}
	}
	return out
}

// netOf lists the namespaces, links and qdiscs whose names start with prefix.
func netOf(prefix string) []string {
	var out []string
	for _, name := range netNames() {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	for _, line := range strings.Split(cmdOut("tc", "qdisc", "show"), "\n") {
		if strings.Contains(line, " dev "+prefix) {
			out = append(out, "qdisc: "+line)
		}
	}
	return append(out, cutsOf(prefix)...)
}

// TestNetLayerRemovedOnSignalOrSwept proves the network layer's cleanup: a run that gets
// SIGTERM removes its bridge, namespace, veth pair, qdiscs and broker cut (its iptables chain
// and cgroup, the broker moved back) before it dies; what a run killed with SIGKILL left
// behind, the next run's sweep removes.
func TestNetLayerRemovedOnSignalOrSwept(t *testing.T) {
	if why := NetSupported(); why != "" {
		t.Skip("skipping the network layer: " + why)
	}
	cmd, prefix, stand := netChild(t)
	// Three links (bridge, the worker's veth pair, its end in the namespace is not listed on
	// the host) and the namespace: at least the bridge, the host's veth end and the namespace.
	if got := netOf(prefix); len(got) < 3 {
		t.Fatalf("the child's network: %v, want its bridge, veth and namespace", got)
	}
	home := cgroupOf(os.Getpid())
	checkCut := func(when string) {
		t.Helper()
		if stand == 0 {
			return
		}
		if got := cutsOf(prefix); len(got) != 1 {
			t.Fatalf("%s: broker cuts %v, want the child's chain and cgroup under one name", when, got)
		}
		if got := cgroupOf(stand); got == home {
			t.Fatalf("%s: the stand-in broker is in %s, want the cut's cgroup", when, got)
		}
	}
	checkBack := func(when string) {
		t.Helper()
		if got := cgroupOf(stand); stand > 0 && got != "/" {
			t.Errorf("%s: the stand-in broker is in cgroup %s, want it back in the root", when, got)
		}
	}
	checkCut("the child's cut")
	if stand == 0 {
		t.Logf("no broker cut: %s", MinoritySupported())
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("the child ended with %v, want death by SIGTERM after its cleanup", err)
	}
	if left := netOf(prefix); len(left) > 0 {
		t.Errorf("left behind after SIGTERM: %v", left)
	}
	checkBack("after SIGTERM")

	cmd, prefix, stand = netChild(t)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if left := netOf(prefix); len(left) < 3 {
		t.Fatalf("after SIGKILL: %v, want the child's network still there", left)
	}
	checkCut("after SIGKILL")
	SweepNet()
	deadline := time.Now().Add(5 * time.Second)
	for len(netOf(prefix)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if left := netOf(prefix); len(left) > 0 {
		t.Errorf("left behind after the sweep: %v", left)
	}
	checkBack("after the sweep")
}

func TestMapLoopback(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"127.0.0.1:9092", "10.1.2.1:9092"},
		{"localhost:5432", "10.1.2.1:5432"},
		{"[::1]:6379", "10.1.2.1:6379"},
		{"192.0.2.7:9092", "192.0.2.7:9092"},
		{"kafka:9092", "kafka:9092"},
	} {
		if got := mapLoopback("10.1.2.1", c.in); got != c.want {
			t.Errorf("mapLoopback(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := mapLoopback("", "127.0.0.1:1"); got != "127.0.0.1:1" {
		t.Errorf("without a host: %q", got)
	}
	for _, c := range []struct{ in, want string }{
		{"postgres://u:p@127.0.0.1:5432/db?search_path=s", "postgres://u:p@10.1.2.1:5432/db?search_path=s"},
		{"postgres://u@db.example:5432/db", "postgres://u@db.example:5432/db"},
		{"postgres://u@localhost/db", "postgres://u@10.1.2.1/db"},
		{"postgres://u@127.0.0.1:5432,127.0.0.1:5433/db?target_session_attrs=read-write", "postgres://u@10.1.2.1:5432,10.1.2.1:5433/db?target_session_attrs=read-write"},
		{"postgres://u%40x:p%2Fw@[::1]:5432/db", "postgres://u%40x:p%2Fw@10.1.2.1:5432/db"},
		{"host=127.0.0.1 port=5432", "host=127.0.0.1 port=5432"}, // not a URL: the harness never passes one
	} {
		if got := mapLoopbackURL("10.1.2.1", c.in); got != c.want {
			t.Errorf("mapLoopbackURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseFaultsNamesTheNetworkKinds(t *testing.T) {
	got, err := ParseFaults("net-broker-cut,net-db-cut,net-flaky,net-heal-mid-tx")
	if err != nil || len(got) != len(NetFaults) {
		t.Fatalf("ParseFaults = %v, %v; want %v", got, err, NetFaults)
	}
	every, err := ParseFaults("every")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range every {
		if isNetFault(k) {
			t.Errorf("'every' holds %s: the network kinds need root and are named one by one", k)
		}
	}
	if _, err := ParseFaults("net-bogus"); err == nil {
		t.Error("ParseFaults accepted an unknown kind")
	}
	got, err = ParseFaults("net-minority-coordinator")
	if err != nil || len(got) != 1 || !isNetFault(got[0]) {
		t.Errorf("ParseFaults(net-minority-coordinator) = %v, %v; want the kind, a network one", got, err)
	}
	for _, nodes := range []int{1, 2} {
		cfg := Config{Faults: got, KafkaNodes: nodes, Brokers: []string{"127.0.0.1:9092"}, PostgresURL: "postgres://x", Binary: "baton"}
		if err := cfg.defaults(); err == nil || !strings.Contains(err.Error(), "three brokers") {
			t.Errorf("%d brokers: %v, want the minority coordinator refused without three", nodes, err)
		}
	}
	cfg := Config{Faults: got, KafkaNodes: 3, Brokers: []string{"127.0.0.1:9092"}, PostgresURL: "postgres://x", Binary: "baton"}
	if err := cfg.defaults(); err == nil || !strings.Contains(err.Error(), "DeployDir") {
		t.Errorf("without DeployDir: %v, want the minority coordinator refused (it reads the cut broker's log through kafka.sh)", err)
	}
}

// TestMemberLines: the cut coordinator's lines are matched by member id, which Kafka derives
// from a static member's group.instance.id (a replacement's from its predecessor's) and from a
// dynamic member's client id (the worker's id). Lines of the log before the fault, of another
// node and of another member whose id only begins alike are not counted.
func TestMemberLines(t *testing.T) {
	const (
		pre  = "[2026-12-02 17:02:40,000] INFO [GroupCoordinator id=2 topic=__consumer_offsets partition=0] Member chaos-w100-0 in group g has failed, removing it from the group. (org.apache.kafka.coordinator.group.GroupMetadataManager)\n"
		cut  = "[2026-12-02 17:02:46,622] INFO [GroupCoordinator id=2 topic=__consumer_offsets partition=0] "
		tail = " (org.apache.kafka.coordinator.group.GroupMetadataManager)"
	)
	lines := []string{
		cut + "Member chaos-w102-1bcf8f9e-7fc2-4509-bc87-c6457f4a8639 in group g has failed, removing it from the group." + tail,
		cut + "Preparing to rebalance group g in state PreparingRebalance with old generation 30 (reason: removing member chaos-w102-1bcf8f9e-7fc2-4509-bc87-c6457f4a8639 on heartbeat expiration.)." + tail,
		cut + "Member chaos-w100-1cd74962-2dee-42a0-b389-8fa59d5969ec in group g has failed, removing it from the group." + tail,
		cut + "Member chaos-w1000-aaaa in group g has failed, removing it from the group." + tail,
		cut + "Preparing to rebalance group g in state PreparingRebalance with old generation 7 (reason: removing member w5-2222 on heartbeat expiration.)." + tail,
		cut + "Member w4-1111 in group g has failed, removing it from the group." + tail,
		cut + "Stabilized group g generation 32 with 1 members." + tail,
		"[2026-12-02 17:02:47,000] INFO [GroupCoordinator id=3 topic=__consumer_offsets partition=0] Member chaos-w100-3333 in group g has failed, removing it from the group." + tail,
	}
	path := filepath.Join(t.TempDir(), "kafka.out")
	if err := os.WriteFile(path, []byte(pre+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := &nodeLogAt{path: path, off: int64(len(pre))}
	static := &proc{id: "w7", instance: "chaos-w100"} // a replacement keeps its predecessor's instance
	named, expired, stabilized := l.memberLines(2, static.memberPrefix(), []string{(&proc{id: "w102", instance: "chaos-w102"}).memberPrefix()})
	if named != 1 || expired != 1 || stabilized != "Stabilized group g generation 32 with 1 members." {
		t.Errorf("static: named %d, expired %d, stabilized %q; want 1, 1 and the last line of node 2's", named, expired, stabilized)
	}
	dynamic := &proc{id: "w4"}
	if named, expired, _ := l.memberLines(2, dynamic.memberPrefix(), []string{(&proc{id: "w5"}).memberPrefix()}); named != 1 || expired != 1 {
		t.Errorf("dynamic: named %d, expired %d; want 1 and 1", named, expired)
	}
}
