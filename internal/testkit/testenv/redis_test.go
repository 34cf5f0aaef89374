package testenv

import (
	"errors"
	"testing"
)

// A server restarted over a port another server took while it was down does not bind it; its
// Start is an error naming that, never a success on the other server's answer (a test would
// then write to, and lose with, a server it does not own).
func TestRedisStartRefusesAnotherServersPort(t *testing.T) {
	a := StartRedis(t)
	b := &RedisServer{Addr: a.Addr, bin: a.bin, args: a.args} // a's port, as a restart over it would use
	t.Cleanup(b.Kill)
	if err := b.Start(); !errors.Is(err, errNotOurs) {
		t.Fatalf("Start on a port another server holds = %v, want errNotOurs", err)
	}
}
