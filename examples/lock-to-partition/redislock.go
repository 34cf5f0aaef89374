package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// redisLock is the naive Redis lease lock this example replaces: SET key value NX PX ttl to
// take it, a compare-and-delete script to release it. It speaks just enough of Redis's
// protocol (RESP2) for that, over one connection; calls are serialized.
type redisLock struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

var _ Locker = (*redisLock)(nil)

// errNotHeld is returned by Release when the lock is no longer ours (its lease expired).
var errNotHeld = errors.New("redislock: lock not held")

const releaseScript = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`

func dialRedisLock(ctx context.Context, addr string) (*redisLock, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("redis: dial %s: %w", addr, err)
	}
	return &redisLock{conn: c, r: bufio.NewReader(c)}, nil
}

func (l *redisLock) Close() error { return l.conn.Close() }

// TryAcquire sets key to value with a TTL if the key is absent, reporting whether it did.
func (l *redisLock) TryAcquire(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	v, err := l.do(ctx, "SET", key, value, "NX", "PX", strconv.FormatInt(ttl.Milliseconds(), 10))
	return v == "OK", err
}

// Get returns key's value, or "" and false if absent.
func (l *redisLock) Get(ctx context.Context, key string) (string, bool, error) {
	v, err := l.do(ctx, "GET", key)
	s, ok := v.(string)
	return s, ok, err
}

// Release deletes key if it still holds value.
func (l *redisLock) Release(ctx context.Context, key, value string) error {
	v, err := l.do(ctx, "EVAL", releaseScript, "1", key, value)
	if err != nil {
		return err
	}
	if v != int64(1) {
		return errNotHeld
	}
	return nil
}

// do sends one command and reads its reply: a simple string, an integer, a bulk string or nil.
func (l *redisLock) do(ctx context.Context, args ...string) (any, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	dl, _ := ctx.Deadline() // zero: no deadline
	_ = l.conn.SetDeadline(dl)
	buf := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		buf = append(buf, "$"+strconv.Itoa(len(a))+"\r\n"+a+"\r\n"...)
	}
	if _, err := l.conn.Write(buf); err != nil {
		return nil, fmt.Errorf("redis: write: %w", err)
	}
	line, err := l.r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("redis: read: %w", err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redis: malformed reply %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, fmt.Errorf("redis: %s", body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err // $-1: nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(l.r, b); err != nil {
			return nil, fmt.Errorf("redis: read: %w", err)
		}
		return string(b[:n]), nil
	}
	return nil, fmt.Errorf("redis: unsupported reply %q", line)
}
