#!/usr/bin/env bash
# postgres-replica.sh CMD - postgres.sh as a second cluster with a streaming standby, for the
# failover tests (internal/operator/chaos: the db-failover fault and what asynchronous
# replication loses), with its own directory and ports (PG_REPLICA_PORT, default 15435, and its
# standby on PG_REPLICA_PORT + 2), so the cluster of postgres.sh that every other test uses is
# never failed over. Same commands as postgres.sh; 'start' makes and starts the standby too
# (PG_STANDBY=sync or async, default sync); 'env' prints the multi-host
# BATON_REPLICA_POSTGRES_URL, and BATON_REPLICA_SCRIPT_ENV, the variables that point postgres.sh
# at this pair (a chaos run's Config.ScriptEnv). The tests start it and reset it; down.sh stops it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
export BATON_STATE_DIR PG_SECURE=""
export PG_STANDBY="${PG_STANDBY:-sync}"
export PG_PORT="${PG_REPLICA_PORT:-15435}" PG_DIR="${PG_REPLICA_DIR:-$BATON_STATE_DIR/postgres-replica}"
export PG_STANDBY_PORT="${PG_REPLICA_STANDBY_PORT:-$((PG_PORT + 2))}"
case "${1:-start}" in
  start) "$HERE/postgres.sh" start && exec "$HERE/postgres.sh" standby start ;;
  env)
    "$HERE/postgres.sh" env | sed 's/BATON_POSTGRES_/BATON_REPLICA_POSTGRES_/'
    # What a chaos run's ScriptEnv needs so that postgres.sh (db-failover, db-restart) acts on this pair.
    echo "export BATON_REPLICA_SCRIPT_ENV='PG_PORT=$PG_PORT PG_STANDBY_PORT=$PG_STANDBY_PORT PG_DIR=$PG_DIR'" ;;
  *) exec "$HERE/postgres.sh" "$@" ;;
esac
