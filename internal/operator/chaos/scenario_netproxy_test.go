package chaos_test

// Network faults for the seeds' Scenario 3: a TCP proxy whose client->server direction can be
// held (the bytes are buffered, not forwarded, as in a congested link) and released. (Scenario
// 4's partitioned member uses internal/testkit/netfreeze.) Every identifier is prefixed netsc to stay
// clear of the other scenario files of this package.

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// netscProxy forwards TCP connections from 127.0.0.1 to upstream. While held, whatever the
// clients send is buffered instead of forwarded; release writes the buffer to the server, in
// order, and forwarding resumes. The server->client direction always flows. All writes to
// servers happen under mu, so a release cannot interleave with a forward.
type netscProxy struct {
	ln       net.Listener
	upstream string

	mu        sync.Mutex
	held      bool
	closed    bool
	pipes     []*netscPipe
	forwarded int64 // client->server bytes written to a server (flushed ones included)
	heldBytes int64 // client->server bytes that were buffered by a hold
	flushed   int64 // buffered bytes written to a server by release

	wg sync.WaitGroup
}

type netscPipe struct {
	client, server net.Conn
	pending        []byte // held client->server bytes, guarded by netscProxy.mu
}

// netscNewProxy listens on 127.0.0.1 and forwards to upstream until the test ends.
func netscNewProxy(t *testing.T, upstream string) *netscProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &netscProxy{ln: ln, upstream: upstream}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's listening address.
func (p *netscProxy) addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

func (p *netscProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		pipe := &netscPipe{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.pipes = append(p.pipes, pipe)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.up(pipe)
		go p.down(pipe)
	}
}

// up copies client->server, or buffers while held.
func (p *netscProxy) up(pipe *netscPipe) {
	defer p.wg.Done()
	defer pipe.closeBoth()
	buf := make([]byte, 32<<10)
	for {
		n, err := pipe.client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			var werr error
			if p.held {
				pipe.pending = append(pipe.pending, buf[:n]...)
				p.heldBytes += int64(n)
			} else {
				_, werr = pipe.server.Write(buf[:n])
				p.forwarded += int64(n)
			}
			p.mu.Unlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// down copies server->client; that direction is never held.
func (p *netscProxy) down(pipe *netscPipe) {
	defer p.wg.Done()
	defer pipe.closeBoth()
	_, _ = io.Copy(pipe.client, pipe.server)
}

func (pipe *netscPipe) closeBoth() {
	_ = pipe.client.Close()
	_ = pipe.server.Close()
}

// hold starts buffering the client->server direction of every connection.
func (p *netscProxy) hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// release writes every held byte to its server, in order, and resumes forwarding.
func (p *netscProxy) release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = false
	var errs []error
	for _, pipe := range p.pipes {
		if len(pipe.pending) == 0 {
			continue
		}
		n, err := pipe.server.Write(pipe.pending)
		p.flushed += int64(n)
		p.forwarded += int64(n)
		pipe.pending = nil
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// netscCounters is a snapshot of a proxy's byte counters.
type netscCounters struct{ forwarded, held, flushed, pending int64 }

func (p *netscProxy) counters() netscCounters {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := netscCounters{forwarded: p.forwarded, held: p.heldBytes, flushed: p.flushed}
	for _, pipe := range p.pipes {
		c.pending += int64(len(pipe.pending))
	}
	return c
}

func (p *netscProxy) close() {
	p.mu.Lock()
	p.closed = true
	pipes := p.pipes
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, pipe := range pipes {
		pipe.closeBoth()
	}
	p.wg.Wait()
}
