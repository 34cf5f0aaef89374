package netfreeze

import (
	"context"
	"net"
	"sync"
)

// Freezer freezes and thaws every connection it dialed. The zero value is not usable; use New.
type Freezer struct {
	mu      sync.Mutex
	frozen  bool
	freezes int
	thawed  chan struct{}
}

// New returns a thawed Freezer.
func New() *Freezer { return &Freezer{thawed: make(chan struct{})} }

// Freeze stops every connection's reads and writes until Thaw.
func (f *Freezer) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen {
		f.frozen = true
		f.freezes++
	}
}

// Thaw lets the connections move again.
func (f *Freezer) Thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.frozen = false
		close(f.thawed)
		f.thawed = make(chan struct{})
	}
}

// Freezes reports how many times Freeze took effect: a test's proof that the fault happened.
func (f *Freezer) Freezes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.freezes
}

func (f *Freezer) wait() {
	f.mu.Lock()
	frozen, thawed := f.frozen, f.thawed
	f.mu.Unlock()
	if frozen {
		<-thawed
	}
}

// Dial has the signature of kgo.Dialer.
func (f *Freezer) Dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, f: f}, nil
}

type conn struct {
	net.Conn
	f *Freezer
}

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.f.wait()
	return n, err
}

func (c *conn) Write(b []byte) (int, error) {
	c.f.wait()
	return c.Conn.Write(b)
}
