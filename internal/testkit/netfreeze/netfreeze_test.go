package netfreeze_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit/netfreeze"
)

// TestFreezeHoldsWritesUntilThaw proves a frozen connection moves no bytes and delivers them
// after the thaw.
func TestFreezeHoldsWritesUntilThaw(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	f := netfreeze.New()
	c, err := f.Dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	f.Freeze()
	wrote := make(chan struct{})
	go func() { _, _ = c.Write([]byte("late")); close(wrote) }()
	select {
	case <-wrote:
		t.Fatal("a write went through a frozen connection")
	case <-time.After(100 * time.Millisecond):
	}
	f.Thaw()
	<-wrote
	c.Close()
	if b := <-got; string(b) != "late" {
		t.Fatalf("server got %q, want the held write", b)
	}
	if f.Freezes() != 1 {
		t.Fatalf("freezes %d, want 1", f.Freezes())
	}
}
