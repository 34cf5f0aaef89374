#!/usr/bin/env bash
# env.sh - print the environment variables that point tests at the services up.sh started:
#   eval "$(deploy/local/env.sh)"
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/kafka.sh" env
"$HERE/postgres.sh" env
"$HERE/redis.sh" env
"$HERE/etcd.sh" env
"$HERE/zookeeper.sh" env
"$HERE/chromium.sh" env
if [[ -n "${BATON_SECURE:-}" ]]; then "$HERE/postgres-secure.sh" env; fi
if [[ -n "${BATON_PG_SHARDS:-}" ]]; then "$HERE/postgres-shards.sh" env; fi
