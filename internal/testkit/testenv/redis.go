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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	s := &RedisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin, args: append([]string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir, "--save", "",
		"--protected-mode", "no", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"),
	}, args...)}
	t.Cleanup(s.Kill) // after TempDir's removal is registered, so it runs first
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

// Start starts the server (again, after Kill, over the same directory) and waits until it
// answers.
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
		err := c.Ping(context.Background()).Err()
		if err == nil {
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
