// Package secure turns the settings of an authenticated, encrypted Kafka listener (TLS with an
// optional client certificate for mutual TLS, SASL/SCRAM) into franz-go options, for the tests,
// the chaos harness and its worker processes. Users pass the same franz-go options themselves
// through consumer.Kafka (see SECURITY.md); this package only spares the repository's own code
// from repeating them.
//
// Secrets are read from files and never held in a field that is printed: a [Kafka] names the
// password's file, so flags, environment variables, errors and logs carry a path, not a secret.
package secure

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Kafka describes how to reach a SASL_SSL (or SSL) listener. The zero value means plaintext.
type Kafka struct {
	CAFile       string // PEM CA bundle that must have signed the broker's certificate
	CertFile     string // client certificate (PEM) for mutual TLS; with KeyFile
	KeyFile      string // client key (PEM)
	ServerName   string // name to verify in the broker's certificate; default: the host dialled
	Mechanism    string // SASL mechanism: SCRAM-SHA-512 (default when User is set) or SCRAM-SHA-256
	User         string // SASL user; empty for no SASL
	PasswordFile string // file holding the SASL password (trailing newline ignored)
}

// Enabled reports whether k asks for TLS or SASL.
func (k Kafka) Enabled() bool { return k.CAFile != "" || k.CertFile != "" || k.User != "" }

// Env variable suffixes read by [FromEnv]: prefix+"CA", prefix+"CERT", and so on.
const (
	EnvCA           = "CA"
	EnvCert         = "CERT"
	EnvKey          = "KEY"
	EnvServerName   = "SERVER_NAME"
	EnvMechanism    = "SASL_MECHANISM"
	EnvUser         = "USER"
	EnvPasswordFile = "PASSWORD_FILE"
)

// FromEnv reads a Kafka from the environment variables prefix+EnvCA, prefix+EnvCert, ...
func FromEnv(prefix string) Kafka {
	g := func(s string) string { return os.Getenv(prefix + s) }
	return Kafka{
		CAFile: g(EnvCA), CertFile: g(EnvCert), KeyFile: g(EnvKey), ServerName: g(EnvServerName),
		Mechanism: g(EnvMechanism), User: g(EnvUser), PasswordFile: g(EnvPasswordFile),
	}
}

// TLSConfig returns the TLS configuration k describes (nil, nil when it asks for no TLS).
func (k Kafka) TLSConfig() (*tls.Config, error) {
	if k.CAFile == "" && k.CertFile == "" && k.KeyFile == "" {
		return nil, nil
	}
	var errs []error
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.ServerName}
	if k.CAFile != "" {
		pem, err := os.ReadFile(k.CAFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("secure: CA file: %w", err))
		} else {
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("secure: CA file %s holds no PEM certificate", k.CAFile))
			}
		}
	}
	if (k.CertFile == "") != (k.KeyFile == "") {
		errs = append(errs, errors.New("secure: a client certificate needs both a certificate and a key file"))
	} else if k.CertFile != "" {
		c, err := tls.LoadX509KeyPair(k.CertFile, k.KeyFile)
		if err != nil {
			// tls errors name the files' problem, never the key's bytes.
			errs = append(errs, fmt.Errorf("secure: client certificate %s: %w", k.CertFile, err))
		} else if now := time.Now(); now.After(c.Leaf.NotAfter) || now.Before(c.Leaf.NotBefore) {
			// The broker would only say "unknown certificate": say why here, at start.
			errs = append(errs, fmt.Errorf("secure: client certificate %s is valid from %s to %s, not now (%s)",
				k.CertFile, c.Leaf.NotBefore.Format(time.RFC3339), c.Leaf.NotAfter.Format(time.RFC3339), now.Format(time.RFC3339)))
		} else {
			cfg.Certificates = []tls.Certificate{c}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Opts returns the franz-go options k describes: kgo.DialTLSConfig and kgo.SASL. Every problem
// (unreadable files, a bad mechanism, a missing password) is reported, joined.
func (k Kafka) Opts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	var errs []error
	tc, err := k.TLSConfig()
	if err != nil {
		errs = append(errs, err)
	} else if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if k.User != "" {
		pw, err := readSecret(k.PasswordFile)
		if err != nil {
			errs = append(errs, err)
		}
		a := scram.Auth{User: k.User, Pass: pw}
		switch strings.ToUpper(k.Mechanism) {
		case "", "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(a.AsSha512Mechanism()))
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(a.AsSha256Mechanism()))
		default:
			errs = append(errs, fmt.Errorf("secure: SASL mechanism %q: want SCRAM-SHA-512 or SCRAM-SHA-256", k.Mechanism))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return opts, nil
}

// readSecret reads a password file. Its errors name the file, never its content.
func readSecret(path string) (string, error) {
	if path == "" {
		return "", errors.New("secure: a SASL user needs a password file")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("secure: password file: %w", err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("secure: password file %s is empty", path)
	}
	return pw, nil
}

// Env returns k as environment variables ("NAME=value") that [FromEnv] with the same prefix
// reads back: paths and names only, never a secret.
func (k Kafka) Env(prefix string) []string {
	var out []string
	for _, f := range []struct{ name, v string }{
		{EnvCA, k.CAFile}, {EnvCert, k.CertFile}, {EnvKey, k.KeyFile}, {EnvServerName, k.ServerName},
		{EnvMechanism, k.Mechanism}, {EnvUser, k.User}, {EnvPasswordFile, k.PasswordFile},
	} {
		if f.v != "" {
			out = append(out, prefix+f.name+"="+f.v)
		}
	}
	return out
}
