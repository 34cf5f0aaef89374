package consumer_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/internal/readme"
)

// The README's first program, run on an in-process Kafka (kfake) and an SQLite file: each
// device's telemetry folded into its twin, every batch in one fenced transaction.
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "telemetry"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("telemetry"))
	if err != nil {
		panic(err)
	}
	defer prod.Close()
	for _, rd := range [][2]string{{"d1", "21.5"}, {"d2", "19.0"}, {"d1", "22.0"}, {"d3", "20.5"}, {"d1", "22.5"}} {
		prod.ProduceSync(context.Background(), &kgo.Record{Key: []byte(rd[0]), Value: []byte(rd[1])})
	}
	dir, err := os.MkdirTemp("", "baton-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "twins.db")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- readme.Consume(ctx, path, brokers) }()

	db, err := sql.Open("sqlite", path)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	var applied int
	for applied < 5 {
		time.Sleep(50 * time.Millisecond)
		db.QueryRow(`SELECT coalesce(sum(updates), 0) FROM twins`).Scan(&applied) // the table appears with the first batch
	}
	cancel()
	fmt.Println("Run:", <-done)
	rows, err := db.Query(`SELECT device, reading, updates FROM twins ORDER BY device`)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var dev, reading string
		var n int
		if err := rows.Scan(&dev, &reading, &n); err != nil {
			panic(err)
		}
		fmt.Println(dev, reading, n)
	}
	// Output:
	// Run: <nil>
	// d1 22.5 3
	// d2 19.0 1
	// d3 20.5 1
}

// The README's first program is readme.Consume, word for word: the README's "Using it" block
// and Consume's declaration are the same text, so the program the README shows is the one
// Example runs and 'baton bench' measures.
func TestReadmeProgram(t *testing.T) {
	readmeMD, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readmeMD), "\n## Using it\n")
	if !ok {
		t.Fatal(`README.md has no "## Using it" section`)
	}
	_, block, ok := strings.Cut(after, "```go\n")
	if !ok {
		t.Fatal(`README.md's "Using it" section has no go block`)
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatal(`README.md's "Using it" go block is not closed`)
	}
	src, err := os.ReadFile("../internal/readme/readme.go")
	if err != nil {
		t.Fatal(err)
	}
	_, decl, ok := strings.Cut(string(src), "\nfunc Consume(")
	if !ok {
		t.Fatal("internal/readme/readme.go has no func Consume")
	}
	decl, _, _ = strings.Cut(decl, "\n}\n")
	decl = "func Consume(" + decl + "\n}\n"
	if block != decl {
		t.Errorf("README.md's first program differs from Consume in internal/readme/readme.go:\nREADME:\n%s\nConsume:\n%s", block, decl)
	}
}
