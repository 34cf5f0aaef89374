package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server of the test's own, on a free port in the test's temporary
// directory, which the test may kill and start again: the shared server of BATON_REDIS_ADDR is
// never restarted.
type RedisServer struct {
	Addr string
	bin  string
	args []string
	cmd  *exec.Cmd
}

// StartRedis starts a RedisServer with args added to its command line (e.g. "--appendonly",
// "yes"); it is killed, with its children, when the test ends. Without redis-server on PATH it
// skips the test, or fails it in CI.
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not on PATH: CI must provide it (deploy/local/redis.sh install)")
		}
		t.Skip("redis-server is not on PATH: install it (deploy/local/redis.sh install)")
	}
	dir := t.TempDir()
	s := &RedisServer{bin: bin}
	var ports []int
	t.Cleanup(func() { releasePorts(ports) }) // once the server is killed
	t.Cleanup(s.Kill)                         // after TempDir's removal is registered, so it runs first
	// A free port can be taken between the probe and the server's bind (by another test's
	// server, or by one restarting over its own port): a server that did not get its port is
	// seen by its process id, and a fresh port is tried.
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		ports = append(ports, port)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.args = append([]string{
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir, "--save", "",
			"--protected-mode", "no", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"),
		}, args...)
		err := s.Start()
		if err == nil {
			return s
		}
		if !errors.Is(err, errNotOurs) || attempt == 5 {
			t.Fatal(err)
		}
	}
}

// redisPorts are the ports of this process's RedisServers, kept while the test may restart
// its server over the port: no other server of this process is given one of them.
var redisPorts = struct {
	sync.Mutex
	held map[int]bool
}{held: map[int]bool{}}

func freePort(t testing.TB) int {
	t.Helper()
	redisPorts.Lock()
	defer redisPorts.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !redisPorts.held[port] {
			redisPorts.held[port] = true
			return port
		}
	}
}

func releasePorts(ports []int) {
	redisPorts.Lock()
	defer redisPorts.Unlock()
	for _, p := range ports {
		delete(redisPorts.held, p)
	}
}

// errNotOurs is the error of Start when the server answering on the port is another process:
// this one did not get its port.
var errNotOurs = errors.New("another process answers on the server's port")

// Start starts the server (again, after Kill, over the same directory) and waits until it
// answers, as its own process: a server that could not bind its port (another process took it
// while this one was down) is an error, never another server taken for it.
func (s *RedisServer) Start() error {
	s.cmd = exec.Command(s.bin, s.args...)
	// Its own process group: Kill takes its forked children (AOF rewrites, snapshots) too.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.InfoMap(context.Background(), "server").Result()
		if err == nil {
			if pid := info["Server"]["process_id"]; pid != strconv.Itoa(s.cmd.Process.Pid) {
				s.Kill()
				return fmt.Errorf("redis-server on %s: %w (process %s, this server's %d)", s.Addr, errNotOurs, pid, s.cmd.Process.Pid)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("redis-server on %s did not answer", s.Addr), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill ends the server and its children with SIGKILL: no shutdown, no last write.
func (s *RedisServer) Kill() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Wait()
	for range 100 { // the children are gone once signalling the group fails
		if syscall.Kill(-s.cmd.Process.Pid, 0) != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
