package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/internal/secure"
)

// Environment variables naming the secure services: the broker's SASL_SSL listener (BATON_SECURE=1
// deploy/local/kafka.sh) and the TLS-only PostgreSQL (deploy/local/postgres-secure.sh). They hold
// addresses and file paths, never a secret. The runtime principal's and role's settings are the
// plain names; the ADMIN ones create topics, ACLs, schemas and tables.
const (
	EnvSecureKafka         = "BATON_SECURE_KAFKA_BROKERS"      // the SASL_SSL listener, e.g. localhost:19094
	EnvSecureKafkaPrefix   = "BATON_SECURE_KAFKA_"             // + CA, CERT, KEY, USER, PASSWORD_FILE (secure.FromEnv)
	EnvSecureKafkaAdmin    = "BATON_SECURE_KAFKA_ADMIN_"       // + USER, PASSWORD_FILE: a super user
	EnvSecurePostgres      = "BATON_SECURE_POSTGRES_URL"       // runtime role, sslmode=verify-full, passfile=
	EnvSecurePostgresAdmin = "BATON_SECURE_POSTGRES_ADMIN_URL" // migration role, same server
)

const secureHint = "start them with 'BATON_SECURE=1 make up' and export what 'BATON_SECURE=1 make env' prints"

func missingSecure(t testing.TB, env string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not set: CI must provide the secure services (%s)", env, secureHint)
	}
	t.Skipf("%s is not set: %s", env, secureHint)
}

// SecureKafkaEnv is the broker's SASL_SSL listener with the ACL authorizer: Runtime is the
// least-privilege principal (no ACL but those a test grants), Admin a super user.
type SecureKafkaEnv struct {
	Brokers []string
	Runtime secure.Kafka
	Admin   secure.Kafka
}

// SecureKafka returns the SASL_SSL listener's settings, or skips/fails when none is configured.
func SecureKafka(t testing.TB) *SecureKafkaEnv {
	t.Helper()
	v := os.Getenv(EnvSecureKafka)
	if v == "" {
		missingSecure(t, EnvSecureKafka)
	}
	rt := secure.FromEnv(EnvSecureKafkaPrefix)
	adm := rt
	adm.User = os.Getenv(EnvSecureKafkaAdmin + secure.EnvUser)
	adm.PasswordFile = os.Getenv(EnvSecureKafkaAdmin + secure.EnvPasswordFile)
	if rt.User == "" || adm.User == "" || rt.CAFile == "" {
		t.Fatalf("%s is set but the CA, the runtime user or the admin user is not (%s)", EnvSecureKafka, secureHint)
	}
	return &SecureKafkaEnv{Brokers: strings.Split(v, ","), Runtime: rt, Admin: adm}
}

// Opts returns the seed brokers and the TLS and SASL options of k.
func (e *SecureKafkaEnv) Opts(t testing.TB, k secure.Kafka) []kgo.Opt {
	t.Helper()
	opts, err := k.Opts()
	if err != nil {
		t.Fatalf("secure kafka options: %v", err)
	}
	return append([]kgo.Opt{kgo.SeedBrokers(e.Brokers...)}, opts...)
}

// RuntimeOpts returns the client options of the least-privilege principal.
func (e *SecureKafkaEnv) RuntimeOpts(t testing.TB) []kgo.Opt { return e.Opts(t, e.Runtime) }

// AdminOpts returns the client options of the super user.
func (e *SecureKafkaEnv) AdminOpts(t testing.TB) []kgo.Opt { return e.Opts(t, e.Admin) }

func (e *SecureKafkaEnv) admin(t testing.TB, f func(context.Context, *kadm.Client) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(e.AdminOpts(t)...)
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	defer cl.Close()
	if err := f(ctx, kadm.NewClient(cl)); err != nil {
		t.Fatal(err)
	}
}

// AdminTopic creates a topic as the admin, grants nothing, and deletes it when the test ends.
func (e *SecureKafkaEnv) AdminTopic(t testing.TB, partitions int32) string {
	t.Helper()
	name := UniqueName("t")
	e.admin(t, func(ctx context.Context, adm *kadm.Client) error {
		resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
		return errors.Join(err, resp.Err)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		opts, err := e.Admin.Opts()
		if err != nil {
			return
		}
		cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(e.Brokers...))...)
		if err != nil {
			return
		}
		defer cl.Close()
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, name)
	})
	return name
}

// Topic creates a topic and grants the runtime principal what Baton needs on it: read (consume),
// write (produce, idempotently) and describe; nothing else.
func (e *SecureKafkaEnv) Topic(t testing.TB, partitions int32) string {
	t.Helper()
	name := e.AdminTopic(t, partitions)
	e.Grant(t, kadm.NewACLs().Topics(name), kadm.OpRead, kadm.OpWrite, kadm.OpDescribe)
	return name
}

// Group returns a new group name on which the runtime principal may read (join, commit) and describe.
func (e *SecureKafkaEnv) Group(t testing.TB) string {
	t.Helper()
	name := UniqueName("g")
	e.Grant(t, kadm.NewACLs().Groups(name), kadm.OpRead, kadm.OpDescribe)
	return name
}

// Grant allows the runtime principal ops on the resources of b (literal names), from any
// host, and removes the ACLs when the test ends.
func (e *SecureKafkaEnv) Grant(t testing.TB, b *kadm.ACLBuilder, ops ...kadm.ACLOperation) {
	t.Helper()
	e.grant(t, b.ResourcePatternType(kadm.ACLPatternLiteral), ops)
}

// GrantPrefixed is Grant for every resource whose name starts with the names of b.
func (e *SecureKafkaEnv) GrantPrefixed(t testing.TB, b *kadm.ACLBuilder, ops ...kadm.ACLOperation) {
	t.Helper()
	e.grant(t, b.ResourcePatternType(kadm.ACLPatternPrefixed), ops)
}

func (e *SecureKafkaEnv) grant(t testing.TB, b *kadm.ACLBuilder, ops []kadm.ACLOperation) {
	t.Helper()
	b = b.Allow("User:" + e.Runtime.User).AllowHosts().Operations(ops...)
	e.admin(t, func(ctx context.Context, adm *kadm.Client) error {
		res, err := adm.CreateACLs(ctx, b)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Err != nil {
				return r.Err
			}
		}
		return nil
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		opts, err := e.Admin.Opts()
		if err != nil {
			return
		}
		cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(e.Brokers...))...)
		if err != nil {
			return
		}
		defer cl.Close()
		_, _ = kadm.NewClient(cl).DeleteACLs(ctx, b)
	})
}

// SecurePG is a test's schema on the TLS-only PostgreSQL: owned by the migration role (Admin),
// used by the runtime role (Runtime), which may use the schema and nothing in it until the
// test grants it (the stores' RuntimeGrants, through Grant).
type SecurePG struct {
	Admin, Runtime *pgxpool.Pool // both with search_path = Schema
	Schema         string
	RuntimeRole    string
	RuntimeURL     string // the runtime role's URL with search_path set, for child processes
}

// SecurePostgresURLs returns the runtime and admin URLs, or skips/fails when none is configured.
func SecurePostgresURLs(t testing.TB) (runtime, admin string) {
	t.Helper()
	runtime, admin = os.Getenv(EnvSecurePostgres), os.Getenv(EnvSecurePostgresAdmin)
	if runtime == "" || admin == "" {
		missingSecure(t, EnvSecurePostgres)
	}
	return runtime, admin
}

// SecurePostgres creates a schema owned by the migration role, lets the runtime role use it
// (USAGE only), and returns a pool for each role; the schema is dropped when the test ends.
func SecurePostgres(t testing.TB) *SecurePG {
	t.Helper()
	rtURL, admURL := SecurePostgresURLs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rtCfg, err := pgxpool.ParseConfig(rtURL)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvSecurePostgres, err)
	}
	p := &SecurePG{Schema: UniqueName("test"), RuntimeRole: rtCfg.ConnConfig.User}
	admin, err := pgx.Connect(ctx, admURL)
	if err != nil {
		t.Fatalf("connect as the migration role: %v", err)
	}
	defer admin.Close(context.Background())
	s := pgx.Identifier{p.Schema}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+s+"; GRANT USAGE ON SCHEMA "+s+" TO "+pgx.Identifier{p.RuntimeRole}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admURL)
		if err != nil {
			t.Logf("drop schema %s: %v", p.Schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+s+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", p.Schema, err)
		}
	})
	pool := func(url string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = p.Schema
		pl, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("pool: %v", err)
		}
		t.Cleanup(pl.Close)
		return pl
	}
	p.Admin = pool(admURL)
	p.Runtime = pool(rtURL)
	p.RuntimeURL = rtURL + "&search_path=" + p.Schema
	if !strings.Contains(rtURL, "?") {
		p.RuntimeURL = rtURL + "?search_path=" + p.Schema
	}
	return p
}

// Grant runs statements (GRANTs) as the migration role in the test's schema.
func (p *SecurePG) Grant(t testing.TB, stmts []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range stmts {
		if _, err := p.Admin.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// BadCerts are files for the failure cases of the secure tests.
type BadCerts struct {
	UntrustedCA string // a CA that signed nothing the servers present
	ExpiredCert string // a client certificate signed by the servers' CA, expired yesterday
	ExpiredKey  string
	// A server certificate for localhost signed by the servers' CA, expired yesterday.
	ExpiredServerCert, ExpiredServerKey string
}

// MakeBadCerts writes BadCerts into the test's temporary directory. The expired certificate is
// signed with the key next to caFile (ca.key, as deploy/local/tls.sh leaves it).
func MakeBadCerts(t testing.TB, caFile string) BadCerts {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := func() (*ecdsa.PrivateKey, []byte) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return k, der
	}
	now := time.Now()
	// The untrusted CA: self-signed, and names localhost like the real server certificate.
	uk, _ := key()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "untrusted-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, ca, ca, &uk.PublicKey, uk)
	if err != nil {
		t.Fatal(err)
	}
	out := BadCerts{UntrustedCA: write("untrusted-ca.crt", "CERTIFICATE", der)}

	// The expired client certificate, signed by the real CA.
	pair, err := tls.LoadX509KeyPair(caFile, filepath.Join(filepath.Dir(caFile), "ca.key"))
	if err != nil {
		t.Fatalf("the servers' CA key (next to %s): %v", caFile, err)
	}
	realCA, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	ck, ckDER := key()
	leaf := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "baton-runtime"},
		NotBefore: now.Add(-72 * time.Hour), NotAfter: now.Add(-24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err = x509.CreateCertificate(rand.Reader, leaf, realCA, &ck.PublicKey, pair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	out.ExpiredCert = write("expired.crt", "CERTIFICATE", der)
	out.ExpiredKey = write("expired.key", "PRIVATE KEY", ckDER)
	sk, skDER := key()
	leaf = &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano() + 1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-72 * time.Hour), NotAfter: now.Add(-24 * time.Hour), DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err = x509.CreateCertificate(rand.Reader, leaf, realCA, &sk.PublicKey, pair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	out.ExpiredServerCert = write("expired-server.crt", "CERTIFICATE", der)
	out.ExpiredServerKey = write("expired-server.key", "PRIVATE KEY", skDER)
	return out
}

// Secrets returns the content of every secret file the secure settings name (Kafka password
// files, the pgpass file's passwords), so that tests can check no output holds one.
func Secrets(t testing.TB) []string {
	t.Helper()
	var files []string
	for _, e := range []string{EnvSecureKafkaPrefix + secure.EnvPasswordFile, EnvSecureKafkaAdmin + secure.EnvPasswordFile} {
		if f := os.Getenv(e); f != "" {
			files = append(files, f)
		}
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.TrimSpace(string(b)))
	}
	if u := os.Getenv(EnvSecurePostgres); u != "" {
		if i := strings.Index(u, "passfile="); i >= 0 {
			f, _, _ := strings.Cut(u[i+len("passfile="):], "&")
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if i := strings.LastIndexByte(line, ':'); i >= 0 && line[i+1:] != "" {
					out = append(out, line[i+1:])
				}
			}
		}
	}
	return out
}

// NoSecrets fails the test if out contains any of secrets. what names the output.
func NoSecrets(t testing.TB, what, out string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if len(s) >= 8 && strings.Contains(out, s) {
			t.Errorf("%s contains a password (%d bytes of output)", what, len(out))
		}
	}
}
