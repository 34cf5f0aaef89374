package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// TestEnvironmentNames: every command that reaches Kafka, the store or a group takes its
// default from the one set of names (BATON_KAFKA_BROKERS, BATON_POSTGRES_URL, BATON_GROUP,
// BATON_LOG_*), the demo from none of them, and a name an earlier release read is refused with
// its replacement named.
func TestEnvironmentNames(t *testing.T) {
	t.Setenv(envBrokers, "k-env:9092")
	t.Setenv(envPostgres, "postgres://from-env/db")
	t.Setenv(envGroup, "g-env")
	t.Setenv(envLogFormat, "json")
	t.Setenv(envLogLevel, "debug")
	for old := range renamedEnv {
		t.Setenv(old, "")
	}
	// flag -> the default its help must show, per command.
	want := map[string]map[string]string{
		"status":   {"brokers": "k-env:9092", "store": "postgres://from-env/db", "group": "g-env", "log-format": "json", "log-level": "debug"},
		"audit":    {"brokers": "k-env:9092", "store": "postgres://from-env/db", "group": "g-env", "log-format": "json", "log-level": "debug"},
		"who-owns": {"brokers": "k-env:9092", "store": "postgres://from-env/db", "group": "g-env"},
		"eras":     {"store": "postgres://from-env/db", "group": "g-env"},
		"recover":  {"brokers": "k-env:9092", "store": "postgres://from-env/db", "group": "g-env"},
		"topics":   {"brokers": "k-env:9092", "store": "postgres://from-env/db", "group": "g-env"},
		"migrate":  {"store": "postgres://from-env/db"},
		"chaos":    {"brokers": "k-env:9092", "postgres": "postgres://from-env/db"},
		"bench":    {"brokers": "k-env:9092", "postgres": "postgres://from-env/db"},
		"demo":     {"brokers": "", "postgres": ""},
	}
	for cmd, flags := range want {
		var out bytes.Buffer
		if code := run([]string{cmd, "-h"}, &out, &out); code != 0 {
			t.Fatalf("%s -h exited %d:\n%s", cmd, code, out.String())
		}
		for name, def := range flags {
			m := regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(name) + ` .*\n((?:    .*\n)*)`).FindStringSubmatch(out.String())
			if m == nil {
				t.Errorf("%s has no -%s:\n%s", cmd, name, out.String())
				continue
			}
			got := regexp.MustCompile(`\(default "([^"]*)"\)`).FindStringSubmatch(m[1])
			switch {
			case def == "" && got != nil:
				t.Errorf("%s -%s defaults to %q from the environment, want no default", cmd, name, got[1])
			case def != "" && (got == nil || got[1] != def):
				t.Errorf("%s -%s: help %q, want the default %q from the environment", cmd, name, m[1], def)
			}
		}
	}
	for old, now := range renamedEnv {
		t.Setenv(old, "x")
		var out bytes.Buffer
		code := run([]string{"eras", "-group", "g", "-store", t.TempDir() + "/none.db"}, &out, &out)
		if code != 2 || !strings.Contains(out.String(), "$"+old+" is no longer read: use "+now) {
			t.Errorf("with $%s set: exit %d, output %q; want 2 and the replacement %s named", old, code, out.String(), now)
		}
		t.Setenv(old, "")
	}
	var out bytes.Buffer
	if code := run([]string{"status", "-log-format", "xml"}, &out, &out); code != 2 || !strings.Contains(out.String(), `log format "xml"`) {
		t.Errorf("-log-format xml: exit %d, %q; want 2 naming the format", code, out.String())
	}
}
