#!/usr/bin/env bash
# postgres-shards.sh CMD [N] - N more PostgreSQL clusters, one per shard of a sharded sink
# (fence/shard), each postgres.sh's plaintext cluster on its own directory and port:
# PG_SHARDS clusters (default 3) on ports PG_SHARD_PORT, PG_SHARD_PORT+1, ... (default 15441)
# in $BATON_STATE_DIR/postgres-shard-1, -2, ... Same commands as postgres.sh, run on each, or
# on cluster N alone (1 to PG_SHARDS; the chaos harness's shard-outage stops and starts one);
# 'env' prints BATON_POSTGRES_SHARD_URLS, the clusters' URLs comma-separated in shard order.
# up.sh starts them only when BATON_PG_SHARDS is set (to the count), and env.sh prints their
# variable then: the default 'make up' starts none (the fast three-shard tests use three
# schemas on postgres.sh's cluster).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
PG_SHARDS="${PG_SHARDS:-${BATON_PG_SHARDS:-3}}"
PG_SHARD_PORT="${PG_SHARD_PORT:-15441}"
PG_HOST="${PG_HOST:-127.0.0.1}" PG_USER="${PG_USER:-baton}" PG_PASSWORD="${PG_PASSWORD:-baton}" PG_DB="${PG_DB:-baton}"
[[ "$PG_SHARDS" =~ ^[1-9][0-9]*$ ]] || { echo "[postgres-shards.sh] ERROR: PG_SHARDS=$PG_SHARDS, want a count" >&2; exit 2; }
export BATON_STATE_DIR PG_HOST PG_USER PG_PASSWORD PG_DB

cmd="${1:-start}"
if [[ "$cmd" == env ]]; then
  urls=()
  for ((i = 0; i < PG_SHARDS; i++)); do
    urls+=("postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$((PG_SHARD_PORT + i))/$PG_DB?sslmode=disable")
  done
  (IFS=,; echo "export BATON_POSTGRES_SHARD_URLS='${urls[*]}'")
  exit 0
fi
only="${2:-}"
if [[ -n "$only" ]] && { ! [[ "$only" =~ ^[1-9][0-9]*$ ]] || ((only > PG_SHARDS)); }; then
  echo "[postgres-shards.sh] ERROR: cluster $only, want 1 to $PG_SHARDS" >&2
  exit 2
fi
rc=0
for ((i = 0; i < PG_SHARDS; i++)); do
  [[ -z "$only" || "$only" -eq $((i + 1)) ]] || continue
  PG_PORT=$((PG_SHARD_PORT + i)) PG_DIR="$BATON_STATE_DIR/postgres-shard-$((i + 1))" PG_SECURE= \
    "$HERE/postgres.sh" "$cmd" || rc=$?
done
exit $rc
