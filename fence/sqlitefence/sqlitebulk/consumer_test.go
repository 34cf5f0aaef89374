package sqlitebulk_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence/sqlitefence/sqlitebulk"
)

// TestConsumerGoesOnPastKeysEqualOnlyInTheDatabase runs a consumer whose handler writes
// each record's rows with one Exec for the batch, into a COLLATE NOCASE key: records whose
// keys differ only in case are applied (the refused batch is applied a record at a time),
// a record whose own two rows clash is dead-lettered with the reason naming the key, and
// the partition goes on to the records after it.
func TestConsumerGoesOnPastKeysEqualOnlyInTheDatabase(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events", "events.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("events"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// A record's value lists its keys: "Eight,eight" is one record of two rows.
	for _, keys := range []string{"Seven", "seven", "SEVEN", "Eight,eight", "nine"} {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(keys)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	s := open(t)
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE counts (key TEXT COLLATE NOCASE PRIMARY KEY, n INTEGER)`); err != nil {
		t.Fatal(err)
	}
	up, err := sqlitebulk.NewUpsert("counts", []string{"key"}, []sqlitebulk.Column{{Name: "key"}, {Name: "n"}}, "n = t.n + excluded.n")
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New("g", []string{"events"}, s, func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
		var rows [][]any
		for _, r := range b.Records {
			for k := range strings.SplitSeq(string(r.Value), ",") {
				rows = append(rows, []any{k, int64(1)})
			}
		}
		return up.Exec(ctx, tx, rows)
	}, consumer.Kafka(kgo.SeedBrokers(brokers...)), consumer.RetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	dlq, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("events.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	var dead []*kgo.Record
	for len(dead) == 0 {
		fs := dlq.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("no dead letter for the record whose two rows have one key (rows: %s)", counts(t, s.DB()))
		}
		dead = append(dead, fs.Records()...)
	}
	var reason string
	for _, h := range dead[0].Headers {
		if h.Key == "baton.dlq.reason" {
			reason = string(h.Value)
		}
	}
	if len(dead) != 1 || string(dead[0].Value) != "Eight,eight" || !strings.Contains(reason, `"counts"`) || !strings.Contains(reason, `('Eight')`) {
		t.Errorf("dead letters: %d, the first %q with reason %q; want the record Eight,eight, naming the table and the key", len(dead), dead[0].Value, reason)
	}
	for want := "Seven=3 nine=1"; ; {
		got := counts(t, s.DB())
		if got == want {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("rows %q, want %q: the records around the dead letter not applied", got, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// counts lists the table's rows as key=n.
func counts(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT key, n FROM counts ORDER BY key COLLATE BINARY`)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return ""
		}
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s=%d", k, n))
	}
	return strings.Join(out, " ")
}
