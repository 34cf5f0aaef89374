package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseShardURLs(t *testing.T) {
	got, err := parseShardURLs("postgres://u:p@h:1/db?sslmode=disable, eu=postgresql://h:2/db?x=1,postgres://h:3/db")
	if err != nil {
		t.Fatal(err)
	}
	want := []namedURL{{"shard-1", "postgres://u:p@h:1/db?sslmode=disable"}, {"eu", "postgresql://h:2/db?x=1"}, {"shard-3", "postgres://h:3/db"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if got, err := parseShardURLs(""); got != nil || err != nil {
		t.Fatalf("unset: %v, %v", got, err)
	}
	for _, bad := range []string{"a=postgres://h/1,a=postgres://h/2", "mysql://secret@h/db", "postgres://h/1,"} {
		_, err := parseShardURLs(bad)
		if err == nil {
			t.Errorf("%q: no error", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: error echoes the entry: %v", bad, err)
		}
	}
}
