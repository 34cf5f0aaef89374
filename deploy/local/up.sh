#!/usr/bin/env bash
# up.sh - start every service Baton's tests need (idempotent): PostgreSQL, then Kafka.
# Prints nothing on stdout; 'env.sh' prints the variables to export.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/postgres.sh" start
"$HERE/kafka.sh" start
