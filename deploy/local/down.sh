#!/usr/bin/env bash
# down.sh - stop the services that up.sh started (and only those). Data is kept; 'reset' wipes it.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rc=0
"$HERE/kafka.sh" "${1:-stop}" || rc=$?
"$HERE/postgres.sh" "${1:-stop}" || rc=$?
"$HERE/redis.sh" stop || rc=$?
"$HERE/etcd.sh" stop || rc=$?
"$HERE/zookeeper.sh" stop || rc=$?
"$HERE/postgres-secure.sh" "${1:-stop}" || rc=$?
# Started by the failover tests only (they reset it when they end): a safety net.
"$HERE/postgres-replica.sh" "${1:-stop}" || rc=$?
if [[ -n "${BATON_PG_SHARDS:-}" ]]; then "$HERE/postgres-shards.sh" "${1:-stop}" || rc=$?; fi
exit $rc
