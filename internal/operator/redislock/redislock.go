package redislock

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

// ErrNotHeld is returned by Release and Extend when the lock is not (or no longer) ours.
var ErrNotHeld = errors.New("redislock: lock not held")

const releaseScript = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`
const extendScript = `if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`

// Client is one connection to Redis. It is safe for concurrent use (calls are serialized).
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// Dial connects to addr (host:port).
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("redislock: dial %s: %w", addr, err)
	}
	return &Client{conn: c, r: bufio.NewReader(c)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// TryAcquire sets key to value with a TTL if the key is absent, reporting whether it did.
func (c *Client) TryAcquire(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	v, err := c.do(ctx, "SET", key, value, "NX", "PX", strconv.FormatInt(ttl.Milliseconds(), 10))
	if err != nil {
		return false, err
	}
	return v == "OK", nil
}

// Release deletes key if it still holds value.
func (c *Client) Release(ctx context.Context, key, value string) error {
	v, err := c.do(ctx, "EVAL", releaseScript, "1", key, value)
	if err != nil {
		return err
	}
	if v != int64(1) {
		return ErrNotHeld
	}
	return nil
}

// Extend resets key's TTL if it still holds value.
func (c *Client) Extend(ctx context.Context, key, value string, ttl time.Duration) error {
	v, err := c.do(ctx, "EVAL", extendScript, "1", key, value, strconv.FormatInt(ttl.Milliseconds(), 10))
	if err != nil {
		return err
	}
	if v != int64(1) {
		return ErrNotHeld
	}
	return nil
}

// Get returns key's value, or "" and false if absent.
func (c *Client) Get(ctx context.Context, key string) (string, bool, error) {
	v, err := c.do(ctx, "GET", key)
	if err != nil || v == nil {
		return "", false, err
	}
	s, ok := v.(string)
	return s, ok, nil
}

func (c *Client) do(ctx context.Context, args ...string) (any, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetDeadline(dl)
	} else {
		_ = c.conn.SetDeadline(time.Time{})
	}
	buf := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		buf = append(buf, '$')
		buf = strconv.AppendInt(buf, int64(len(a)), 10)
		buf = append(buf, "\r\n"...)
		buf = append(buf, a...)
		buf = append(buf, "\r\n"...)
	}
	if _, err := c.conn.Write(buf); err != nil {
		return nil, fmt.Errorf("redislock: write: %w", err)
	}
	return readReply(c.r)
}

// readReply reads one RESP2 reply: simple string, error, integer, bulk string or nil.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("redislock: read: %w", err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("redislock: malformed reply %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, fmt.Errorf("redislock: server error: %s", body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("redislock: bad bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("redislock: read bulk: %w", err)
		}
		return string(b[:n]), nil
	}
	return nil, fmt.Errorf("redislock: unsupported reply type %q", line[0])
}
