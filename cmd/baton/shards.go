package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// namedURL is one shard of $BATON_POSTGRES_SHARD_URLS.
type namedURL struct {
	Name string
	URL  string
}

var shardEntry = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9_.-]{0,62})=(postgres(?:ql)?://.*)$`)

// shardURLs parses $BATON_POSTGRES_SHARD_URLS, the PostgreSQL databases of a sharded sink
// (fence/shard), comma separated, home shard first: each entry is NAME=URL, or a bare URL
// named by its position (shard-1, shard-2, ...). Nil when it is unset (one database,
// $BATON_POSTGRES_URL). The home shard, which
// holds the placement's history, is the first.
func shardURLs() ([]namedURL, error) {
	return parseShardURLs(os.Getenv(envShards))
}

func parseShardURLs(v string) ([]namedURL, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var out []namedURL
	seen := map[string]bool{}
	for i, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		n := namedURL{Name: fmt.Sprintf("shard-%d", i+1), URL: e}
		if m := shardEntry.FindStringSubmatch(e); m != nil {
			n = namedURL{Name: m[1], URL: m[2]}
		}
		if !strings.HasPrefix(n.URL, "postgres://") && !strings.HasPrefix(n.URL, "postgresql://") {
			// The entry is not echoed: a malformed URL may carry a password.
			return nil, fmt.Errorf("$%s: entry %d is neither NAME=URL nor a postgres:// URL", envShards, i+1)
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("$%s: shard name %q is given twice", envShards, n.Name)
		}
		seen[n.Name] = true
		out = append(out, n)
	}
	return out, nil
}
