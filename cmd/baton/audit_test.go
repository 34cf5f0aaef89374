package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestAuditOnce: 'baton audit -once' exits 0 when every check passes and 1 with the violation
// and its evidence when one fails (here a Kafka commit ahead of the sink's position).
func TestAuditOnce(t *testing.T) {
	ctx := context.Background()
	brokers := testenv.FakeKafka(t)
	topic := testenv.NewTopic(t, brokers, 1)
	db := filepath.Join(t.TempDir(), "b.db")
	st, err := sqlitefence.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: topic, Partition: 0}
	if _, err := st.Claim(ctx, k, fence.Token{Epoch: 2}, "test"); err != nil {
		t.Fatal(err)
	}
	args := []string{"audit", "-once", "-group", "g", "-brokers", strings.Join(brokers, ","), "-store", db}
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != 0 || !strings.Contains(out.String(), "group g: 1 partitions, 0 violations") {
		t.Fatalf("audit -once on a sound group exited %d:\n%s%s", code, out.String(), errb.String())
	}
	if _, err := st.DB().ExecContext(ctx, `UPDATE baton_fences SET era = 3`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	code := run(args, &out, &errb)
	if code != 1 || !strings.Contains(out.String(), "VIOLATION tokens: era with no recorded recovery") || !strings.Contains(out.String(), "stored=3.2") {
		t.Fatalf("audit -once on an era raised by hand exited %d, want 1 and the violation:\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "level=ERROR") || !strings.Contains(errb.String(), "stored=3.2") {
		t.Errorf("the violation is not logged with its evidence:\n%s", errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"audit", "-once", "-group", "other", "-brokers", strings.Join(brokers, ","), "-store", db}, &out, &errb); code != 1 || !strings.Contains(errb.String(), `no fence rows for group "other"`) {
		t.Errorf("audit -once of a group the store does not know exited %d, want 1 saying so:\n%s%s", code, out.String(), errb.String())
	}
	if code := run([]string{"audit", "-group", "g", "-once", "-http", "127.0.0.1:0", "-brokers", "b", "-store", db}, &out, &errb); code != 2 {
		t.Errorf("audit -once -http exited %d, want 2", code)
	}
}

// TestWriteAuditNamesRecreatedTopics: the printed report names a topic whose fences were not
// judged against the log because it was recreated and not yet reset.
func TestWriteAuditNamesRecreatedTopics(t *testing.T) {
	var out bytes.Buffer
	writeAudit(&out, "g", &audit.Report{Recreated: []audit.RecreatedTopic{{Topic: "orders", StoredID: "AAAA", BrokerID: "BBBB", Fences: 3}}})
	want := "topic orders recreated (topic id stored with the fences AAAA, on the brokers BBBB): 3 fences not judged against the log until 'baton topics reset'"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("writeAudit printed:\n%s\nwant a line %q", out.String(), want)
	}
}
