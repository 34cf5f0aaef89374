#!/usr/bin/env bash
# with-services.sh CMD [ARGS...] - run CMD with PostgreSQL, Kafka and Redis (the chaos baseline's
# lock) up and their addresses in the environment (BATON_POSTGRES_URL, BATON_KAFKA_BROKERS,
# BATON_REDIS_ADDR), Chromium installed for the status page's browser test and promtool for the
# rules files' check. Services that
# were already running are used and left running; services this script started are stopped when
# CMD ends, also on failure or interrupt. Exits with CMD's status. With BATON_DRY_RUN=1 it only says what it would
# install and run.
#
# BATON_PG_SHARDS=N adds N PostgreSQL shard clusters (postgres-shards.sh) and exports their
# BATON_POSTGRES_SHARD_URLS.
#
# BATON_SECURE=1 adds the secure services (secure tests, internal/testkit/testenv): the broker gets its
# SASL_SSL listener with the ACL authorizer (kafka.sh), and a TLS-only PostgreSQL with a
# migration and a runtime role runs next to the plaintext one (postgres-secure.sh); their
# BATON_SECURE_* variables are exported too.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ $# -gt 0 ]] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }

started=()
cleanup() {
  local s
  for s in "${started[@]}"; do "$HERE/$s.sh" stop || true; done
  # The failover tests' own primary and standby (they reset it; this catches a killed run).
  "$HERE/postgres-replica.sh" stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

services=(postgres kafka redis etcd zookeeper)
if [[ -n "${BATON_SECURE:-}" ]]; then services+=(postgres-secure); fi
if [[ -n "${BATON_PG_SHARDS:-}" ]]; then services+=(postgres-shards); fi
for s in "${services[@]}"; do
  if ! "$HERE/$s.sh" status 2>/dev/null; then
    started+=("$s")
    "$HERE/$s.sh" start
  fi
done
# Not a service: the browser the status page's test drives (internal/operator/status). Installed once.
"$HERE/chromium.sh" install
# Not a service either: promtool, which internal/deploytest runs on deploy/prometheus's rules.
"$HERE/promtool.sh" install
if [[ -n "${BATON_DRY_RUN:-}" ]]; then echo "[with-services.sh] dry run: would run: $*" >&2; exit 0; fi
eval "$("$HERE/env.sh")"
"$@"
