#!/usr/bin/env bash
# up.sh - start every service Baton's tests need (idempotent): PostgreSQL, Kafka, and
# Redis (only the chaos harness's lock baseline uses it). BATON_PG_SHARDS=N adds N PostgreSQL
# clusters for sharded sinks (postgres-shards.sh).
# Prints nothing on stdout; 'env.sh' prints the variables to export.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/postgres.sh" start
"$HERE/kafka.sh" start
"$HERE/redis.sh" start
"$HERE/etcd.sh" start
"$HERE/zookeeper.sh" start
if [[ -n "${BATON_SECURE:-}" ]]; then "$HERE/postgres-secure.sh" start; fi
if [[ -n "${BATON_PG_SHARDS:-}" ]]; then "$HERE/postgres-shards.sh" start; fi
