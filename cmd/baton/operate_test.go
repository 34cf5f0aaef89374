package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOperateBadInput: each bad request gets one sentence naming what was tried, a non-zero
// exit status, and changes nothing (no SQLite file appears).
func TestOperateBadInput(t *testing.T) {
	t.Setenv(envGroup, "") // "status without a group" means none from the environment either
	dir := t.TempDir()
	db := filepath.Join(dir, "missing.db")
	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"status without a group", []string{"status", "-brokers", "127.0.0.1:1", "-store", db}, 2, []string{"no consumer group given"}},
		{"status, unreachable sources", []string{"status", "-group", "g", "-brokers", "127.0.0.1:1", "-store", "postgres://u:pw@127.0.0.1:1/x", "-timeout", "1s"}, 1,
			[]string{"Kafka at 127.0.0.1:1 did not answer", "PostgreSQL at postgres://u:xxxxx@127.0.0.1:1/x did not answer"}},
		{"status, missing SQLite file", []string{"status", "-group", "g", "-brokers", "127.0.0.1:1", "-store", db, "-timeout", "1s"}, 1, []string{"SQLite file " + db}},
		{"status, not a store", []string{"status", "-group", "g", "-brokers", "b:9092", "-store", "mysql://x"}, 2, []string{"only postgres:// URLs and SQLite file paths"}},
		{"who-owns without a key", []string{"who-owns", "-group", "g", "-topic", "t", "-brokers", "b", "-store", db}, 2, []string{"exactly one KEY"}},
		{"who-owns without a topic", []string{"who-owns", "-group", "g", "-brokers", "b", "-store", db, "k"}, 2, []string{"needs the key's topic"}},
		{"who-owns, unknown partitioner", []string{"who-owns", "-group", "g", "-topic", "t", "-brokers", "127.0.0.1:1", "-store", db, "-partitioner", "fnv99", "k"}, 2, []string{`unknown partitioner "fnv99"`}},
		{"recover without a reason", []string{"recover", "-group", "g", "-topic", "t", "-brokers", "127.0.0.1:1", "-store", db}, 2, []string{"recover needs a reason"}},
		{"recover, missing store", []string{"recover", "-group", "g", "-topic", "t", "-reason", "r", "-brokers", "127.0.0.1:1", "-store", db, "-timeout", "1s"}, 1, []string{"SQLite file " + db}},
		{"recover, bad partition", []string{"recover", "-group", "g", "-topic", "t", "-reason", "r", "-partition", "1,x", "-brokers", "b", "-store", db}, 2, []string{`"x" is not a partition number`}},
		{"eras, missing store", []string{"eras", "-group", "g", "-store", db}, 1, []string{"SQLite file " + db}},
		{"schema, unknown dialect", []string{"schema", "-dialect", "oracle"}, 2, []string{`unknown dialect "oracle"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(c.args, &stdout, &stderr)
			if code != c.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, c.code, stderr.String())
			}
			for _, w := range c.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if strings.Contains(stderr.String()+stdout.String(), ":pw@") {
				t.Errorf("the password is shown:\n%s%s", stdout.String(), stderr.String())
			}
		})
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("bad requests created %s (err %v)", db, err)
	}
}

// TestSchemaAndMigrateSQLite: schema prints every table of both stores for both dialects;
// migrate creates them in an SQLite file, after which eras reads it and finds no recoveries.
func TestSchemaAndMigrateSQLite(t *testing.T) {
	for _, d := range []string{"postgres", "sqlite"} {
		var out bytes.Buffer
		if code := run([]string{"schema", "-dialect", d}, &out, os.Stderr); code != 0 {
			t.Fatalf("schema -dialect %s exited %d", d, code)
		}
		for _, table := range []string{`"baton_fences"`, `"baton_fences_recoveries"`, `"baton_fences_keyed"`, `"baton_outbox"`, `"baton_outbox_cursors"`} {
			if !strings.Contains(out.String(), "CREATE TABLE IF NOT EXISTS "+table) {
				t.Errorf("schema -dialect %s lacks table %s", d, table)
			}
		}
	}
	db := filepath.Join(t.TempDir(), "b.db")
	var out, errb bytes.Buffer
	if code := run([]string{"migrate", "-store", db}, &out, &errb); code != 0 || !strings.Contains(out.String(), "migrated SQLite file "+db) {
		t.Fatalf("migrate exited %d: %s%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"eras", "-group", "g", "-store", db}, &out, &errb); code != 0 || !strings.Contains(out.String(), "no recoveries recorded for group g") {
		t.Fatalf("eras exited %d: %s%s", code, out.String(), errb.String())
	}
}
