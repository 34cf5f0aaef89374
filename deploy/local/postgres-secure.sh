#!/usr/bin/env bash
# postgres-secure.sh CMD - postgres.sh in secure mode (PG_SECURE=1: TLS only, verify-full,
# scram-sha-256, a migration and a runtime role), as a second cluster with its own directory and
# port (PG_SECURE_PORT, default 15433), so the plaintext cluster of postgres.sh is left alone.
# Same commands as postgres.sh; 'env' prints BATON_SECURE_POSTGRES_URL (runtime role) and
# BATON_SECURE_POSTGRES_ADMIN_URL (migration role).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
export BATON_STATE_DIR PG_SECURE=1
export PG_PORT="${PG_SECURE_PORT:-15433}" PG_DIR="${PG_SECURE_DIR:-$BATON_STATE_DIR/postgres-secure}"
exec "$HERE/postgres.sh" "$@"
