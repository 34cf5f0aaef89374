package chaos

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestWorkerArgvRoundTrip: what the harness puts on a worker's command line parses back, in
// the worker, to the same arguments. Every field of workerArgs is set in at least one case, so
// a field added without a flag (or a flag the builder forgets) fails here.
func TestWorkerArgvRoundTrip(t *testing.T) {
	cases := []workerArgs{
		{
			ID: "w7", Mode: Fenced, Brokers: []string{"127.0.0.1:9092", "127.0.0.1:9093"},
			Group: "chaos-g", Topic: "chaos-t", SessionTimeout: 1500 * time.Millisecond,
			PostgresURL: "postgres://u@h/db?search_path=chaos_x", CommandEvery: 4, InstanceID: "chaos-w7", CommandTopics: 2,
			RedisSink: "127.0.0.1:6379",
		},
		{
			ID: "w1", Mode: Lock, Brokers: []string{"k:1"}, Group: "g", Topic: "t",
			SessionTimeout: 3 * time.Second, SQLitePath: "/tmp/twins db.sqlite", RedisAddr: "127.0.0.1:16379",
		},
		{
			ID: "w2", Mode: Unfenced, Brokers: []string{"k:1"}, Group: "g", Topic: "t",
			SessionTimeout: time.Minute, SQLitePath: "x.db", App: "saga",
		},
		{
			ID: "w3", Mode: Fenced, Brokers: []string{"k:1"}, Group: "g", Topic: "t",
			SessionTimeout: 3 * time.Second, PostgresURL: "postgres://h/logs",
			ShardURLs: []string{"postgres://a/db?search_path=s", "postgres://b/db?x=1,2"},
		},
	}
	set := map[string]bool{}
	for _, want := range cases {
		got, err := parseWorkerArgs(want.argv(), io.Discard)
		if err != nil {
			t.Fatalf("parse %q: %v", want.argv(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("argv %q parsed back to\n%+v, want\n%+v", want.argv(), got, want)
		}
		v := reflect.ValueOf(want)
		for i := 0; i < v.NumField(); i++ {
			if !v.Field(i).IsZero() {
				set[v.Type().Field(i).Name] = true
			}
		}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeOf(workerArgs{})) {
		if !set[f.Name] {
			t.Errorf("workerArgs.%s is set in no case: the round trip does not cover it", f.Name)
		}
	}
}

func TestWorkerArgsRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		help bool
	}{
		{"help", []string{"-h"}, true},
		{"unknown flag", []string{"-nope"}, false},
		{"bad mode", []string{"-mode", "optimistic", "-sqlite", "x.db"}, false},
		{"no database", []string{"-id", "w1"}, false},
		{"two databases", []string{"-sqlite", "x.db", "-postgres", "postgres://h/db"}, false},
		{"positional", []string{"-sqlite", "x.db", "extra"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseWorkerArgs(tc.args, io.Discard)
			if err == nil {
				t.Fatal("accepted")
			}
			if got := errors.Is(err, flag.ErrHelp); got != tc.help {
				t.Errorf("errors.Is(%v, flag.ErrHelp) = %v, want %v", err, got, tc.help)
			}
			if !tc.help && !errors.Is(err, ErrUsage) {
				t.Errorf("%v is not ErrUsage", err)
			}
		})
	}
}

// TestWorkerFlagsDocumented: every flag the worker parses has a usage line, so '-h' lists it.
func TestWorkerFlagsDocumented(t *testing.T) {
	fs := flag.NewFlagSet(WorkerCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var a workerArgs
	a.flags(fs)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if strings.TrimSpace(f.Usage) == "" {
			t.Errorf("flag -%s has no usage text", f.Name)
		}
	})
	if n != reflect.TypeOf(a).NumField() {
		t.Errorf("%d flags for %d fields of workerArgs", n, reflect.TypeOf(a).NumField())
	}
}
