package main

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// The environment every Baton program reads (the baton command, the twin example's member and
// migration, deploy/local's env.sh, deploy/compose and deploy/k8s): one name per setting.
const (
	envBrokers   = "BATON_KAFKA_BROKERS"       // Kafka seed brokers, comma separated
	envPostgres  = "BATON_POSTGRES_URL"        // the PostgreSQL URL (the fence store)
	envShards    = "BATON_POSTGRES_SHARD_URLS" // a sharded sink's databases, NAME=URL or URL, comma separated, home first
	envGroup     = "BATON_GROUP"               // the consumer group
	envLogFormat = "BATON_LOG_FORMAT"          // text or json
	envLogLevel  = "BATON_LOG_LEVEL"           // debug, info, warn or error
)

// renamedEnv names, for each variable an earlier release read, what replaces it. A program
// that finds one set refuses to start rather than ignore it: a deployment's setting that stops
// being read would otherwise send the program silently elsewhere (docs/upgrade.md).
var renamedEnv = map[string]string{
	"BATON_BROKERS":       envBrokers,
	"BATON_STORE":         envPostgres + " (an SQLite file: -store PATH)",
	"BATON_DEMO_BROKERS":  `-brokers (the demo reads no environment: -brokers "$` + envBrokers + `")`,
	"BATON_DEMO_POSTGRES": `-postgres (the demo reads no environment: -postgres "$` + envPostgres + `")`,
}

// checkRenamedEnv returns a usage error naming every renamed variable that is set, and its
// replacement.
func checkRenamedEnv() error {
	var msgs []string
	for _, old := range slices.Sorted(maps.Keys(renamedEnv)) {
		if os.Getenv(old) != "" {
			msgs = append(msgs, fmt.Sprintf("$%s is no longer read: use %s", old, renamedEnv[old]))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return usageError{err: errors.New(strings.Join(msgs, "; "))}
}
