package consumer_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/secure"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// syncBuffer is a log sink several goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func secureConsumerKafka(opts []kgo.Opt) []kgo.Opt {
	return append(opts, kgo.FetchMaxWait(200*time.Millisecond), kgo.SessionTimeout(6*time.Second),
		kgo.HeartbeatInterval(500*time.Millisecond), kgo.RebalanceTimeout(15*time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
}

// TestSecureRuntimeExactlyOnce: two members consume over SASL_SSL (SCRAM-SHA-512, mutual TLS)
// as the runtime principal, which has only its topic's and its group's ACLs, into PostgreSQL
// over verify-full as the runtime role, which has only RuntimeGrants and its own tables' DML:
// every key's state is the fold of its records, and no password reaches the logs.
func TestSecureRuntimeExactlyOnce(t *testing.T) {
	t.Parallel()
	ke := testenv.SecureKafka(t)
	sp := testenv.SecurePostgres(t)
	ctx := testenv.Context(t, 3*time.Minute)
	admin, err := pgfence.New(sp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Admin.Exec(ctx, pgSchema); err != nil {
		t.Fatal(err)
	}
	grants, err := admin.RuntimeGrants(sp.RuntimeRole)
	if err != nil {
		t.Fatal(err)
	}
	sp.Grant(t, append(grants, "GRANT SELECT, INSERT, UPDATE ON kv, writes TO "+sp.RuntimeRole))
	sink, err := pgfence.New(sp.Runtime)
	if err != nil {
		t.Fatal(err)
	}
	topic, group := ke.Topic(t, 4), ke.Group(t)
	const keys, n = 20, 50
	produceOpts(t, ke.RuntimeOpts(t), topic, keys, n)

	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var members []*member
	for i := 0; i < 2; i++ {
		c, err := consumer.New(group, []string{topic}, sink, nil, consumer.PerPartition(pgFolder),
			consumer.Kafka(secureConsumerKafka(append(ke.RuntimeOpts(t), kgo.WithLogger(kgo.BasicLogger(&logs, kgo.LogLevelInfo, nil))))...),
			consumer.Logger(log))
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, start(t, c))
	}
	waitFor(t, "every record applied", 2*time.Minute, func() bool { return pgApplied(t, sp.Runtime) >= keys*n })
	for _, m := range members {
		if err := m.stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	var bad int
	if err := sp.Runtime.QueryRow(ctx, `SELECT count(*) FROM kv WHERE count <> $1 OR last <> $1`, n).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d keys differ from the fold of their records (%v)", bad, err)
	}
	testenv.NoSecrets(t, "the consumers' logs", logs.String(), testenv.Secrets(t))
}

func produceOpts(t testing.TB, opts []kgo.Opt, topic string, keys, n int) {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var rs []*kgo.Record
	for s := 1; s <= n; s++ {
		for k := 0; k < keys; k++ {
			rs = append(rs, &kgo.Record{Key: []byte("k" + strconv.Itoa(k)), Value: []byte(strconv.Itoa(s))})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce as the runtime principal: %v", err)
	}
}

// TestSecureStartFailures: a consumer whose credentials, certificates or ACLs are wrong logs
// the cause at ERROR at once (not a silent retry loop), and its Run returns ErrNotJoined
// naming that cause; nothing was applied, no password is in the logs or the error.
func TestSecureStartFailures(t *testing.T) {
	t.Parallel()
	ke := testenv.SecureKafka(t)
	bad := testenv.MakeBadCerts(t, ke.Runtime.CAFile)
	secrets := append(testenv.Secrets(t), "not-the-password-0123456789")
	wrongPW := filepath.Join(t.TempDir(), "wrong.pass")
	if err := os.WriteFile(wrongPW, []byte("not-the-password-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	expired := func(t *testing.T, k secure.Kafka) []kgo.Opt {
		pair, err := tls.LoadX509KeyPair(bad.ExpiredCert, bad.ExpiredKey)
		if err != nil {
			t.Fatal(err)
		}
		k.CertFile, k.KeyFile = "", ""
		tc, err := k.TLSConfig()
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
		return append(ke.Opts(t, k), kgo.DialTLSConfig(tc))
	}
	for _, c := range []struct {
		name       string
		opts       func(t *testing.T, k secure.Kafka) []kgo.Opt
		group      bool // grant the group's ACLs
		want       string
		noTopicACL bool // create the topic without the runtime principal's ACLs
	}{
		{"wrong password", func(t *testing.T, k secure.Kafka) []kgo.Opt { k.PasswordFile = wrongPW; return ke.Opts(t, k) },
			true, "SASL_AUTHENTICATION_FAILED", false},
		{"untrusted CA", func(t *testing.T, k secure.Kafka) []kgo.Opt { k.CAFile = bad.UntrustedCA; return ke.Opts(t, k) },
			true, "certificate signed by unknown authority", false},
		{"wrong host name", func(t *testing.T, k secure.Kafka) []kgo.Opt { k.ServerName = "wrong.example"; return ke.Opts(t, k) },
			true, "not wrong.example", false},
		{"expired client certificate", expired, true, "tls: unknown certificate", false},
		{"missing group ACL", func(t *testing.T, k secure.Kafka) []kgo.Opt { return ke.Opts(t, k) },
			false, "GROUP_AUTHORIZATION_FAILED", false},
		{"missing topic ACL", func(t *testing.T, k secure.Kafka) []kgo.Opt { return ke.Opts(t, k) },
			true, "TOPIC_AUTHORIZATION_FAILED", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			topic := ke.Topic(t, 1)
			if c.noTopicACL {
				topic = ke.AdminTopic(t, 1)
			}
			group := testenv.UniqueName("g")
			if c.group {
				ke.Grant(t, kadm.NewACLs().Groups(group), kadm.OpRead, kadm.OpDescribe)
			}
			produceOpts(t, ke.AdminOpts(t), topic, 1, 3)
			var logs syncBuffer
			f := newFolder()
			store := newStore(t)
			c2, err := consumer.New(group, []string{topic}, store, nil, consumer.PerPartition(f.factory),
				consumer.Kafka(secureConsumerKafka(c.opts(t, ke.Runtime))...),
				consumer.Logger(slog.New(slog.NewTextHandler(&logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c2.Run(ctx) }()
			// The cause is logged at ERROR at once, well before anyone gives up.
			deadline := time.Now().Add(15 * time.Second)
			for !strings.Contains(logs.String(), "level=ERROR") && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
			err = <-done
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), c.want) {
				t.Errorf("no ERROR naming %q logged within 15s:\n%s", c.want, logs.String())
			}
			if !errors.Is(err, consumer.ErrNotJoined) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run = %v, want ErrNotJoined naming %q", err, c.want)
			}
			f.mu.Lock()
			handled := len(f.attempts)
			f.mu.Unlock()
			if handled != 0 {
				t.Errorf("batches handled on %d partitions without access", handled)
			}
			t.Logf("Run: %v", err)
			testenv.NoSecrets(t, "the logs", logs.String(), secrets)
			testenv.NoSecrets(t, "Run's error", err.Error(), secrets)
			if !strings.HasPrefix(c.name, "missing") {
				return
			}
			// Nothing was lost: once the ACL is granted, every record is applied.
			if c.noTopicACL {
				ke.Grant(t, kadm.NewACLs().Topics(topic), kadm.OpRead, kadm.OpDescribe)
			} else {
				ke.Grant(t, kadm.NewACLs().Groups(group), kadm.OpRead, kadm.OpDescribe)
			}
			c3, err := consumer.New(group, []string{topic}, store, nil, consumer.PerPartition(f.factory),
				consumer.Kafka(secureConsumerKafka(c.opts(t, ke.Runtime))...), consumer.Logger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			m := start(t, c3)
			k := fence.Key{Group: group, Topic: topic, Partition: 0}
			waitFor(t, "the 3 records applied after the grant", time.Minute, func() bool {
				st, err := store.Load(context.Background(), k)
				return err == nil && st.Position == 2
			})
			if err := m.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
