#!/usr/bin/env bash
# outside.sh - prove Baton's examples and its public chaos API work from outside this module.
#
#   (a) every examples/* is copied into a scratch module of its own (example.com/x, with a
#       replace of github.com/batonhq/baton to this checkout), tidied through the module proxy
#       or cache, built and vetted (tests included);
#   (b) internal/testkit/outside/chaosuser (a program with its own small workload on
#       github.com/batonhq/baton/consumer/chaos) is built the same way and run twice: fenced it
#       must PASS, with -unfenced it must FAIL. It uses the services BATON_KAFKA_BROKERS and
#       BATON_POSTGRES_URL name (embedded kfake and SQLite without them) and only the faults
#       that touch its own worker processes (freeze, kill): no shared service is restarted.
#
# Usage: internal/testkit/outside.sh [examples|chaos]   (default: both)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GO="${GO:-go}"
what="${1:-all}"
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/baton-outside-XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT

# module DIR: make DIR a module of its own that uses this checkout of Baton.
module() {
	if ! (cd "$1" && "$GO" mod init example.com/x && "$GO" mod edit -replace "github.com/batonhq/baton=$ROOT" &&
		"$GO" mod tidy) >"$1.mod.log" 2>&1; then
		cat "$1.mod.log"
		echo "outside: $1: go mod init/tidy failed" >&2
		return 1
	fi
}

if [[ "$what" == all || "$what" == examples ]]; then
	for ex in "$ROOT"/examples/*/; do
		name="$(basename "$ex")"
		t0=$SECONDS
		dir="$SCRATCH/examples/$name"
		mkdir -p "$dir"
		cp -R "$ex". "$dir"
		module "$dir"
		(cd "$dir" && "$GO" build ./... && "$GO" vet ./...)
		echo "== outside: examples/$name builds and vets in a module of its own ($((SECONDS - t0))s)"
	done
fi

if [[ "$what" == all || "$what" == chaos ]]; then
	t0=$SECONDS
	dir="$SCRATCH/chaosuser"
	mkdir -p "$dir"
	cp "$ROOT/internal/testkit/outside/chaosuser/main.go.txt" "$dir/main.go"
	module "$dir"
	(cd "$dir" && "$GO" build -o chaosuser .)
	db=SQLite
	if [[ -n "${BATON_POSTGRES_URL:-}" ]]; then db=PostgreSQL; fi
	echo "== outside: chaosuser built ($((SECONDS - t0))s); services: Kafka ${BATON_KAFKA_BROKERS:-embedded (kfake)}, $db"
	args=(-faults freeze,kill -n 2 -workers 3 -partitions 4 -rate 50 -settle 45s)
	t0=$SECONDS
	if ! "$dir/chaosuser" "${args[@]}" >"$SCRATCH/fenced.log" 2>&1; then
		cat "$SCRATCH/fenced.log"
		echo "outside: chaosuser's fenced run did not PASS" >&2
		exit 1
	fi
	grep -E '^verdict' "$SCRATCH/fenced.log"
	echo "== outside: chaosuser fenced: PASS ($((SECONDS - t0))s)"
	t0=$SECONDS
	rc=0
	"$dir/chaosuser" "${args[@]}" -faults freeze -unfenced >"$SCRATCH/unfenced.log" 2>&1 || rc=$?
	if [[ $rc -ne 1 ]] || ! grep -q '^verdict *FAIL' "$SCRATCH/unfenced.log"; then
		cat "$SCRATCH/unfenced.log"
		echo "outside: chaosuser's unfenced run exited $rc without a FAIL verdict: the checker missed the zombie writes" >&2
		exit 1
	fi
	grep -E '^verdict' "$SCRATCH/unfenced.log" | cut -c1-200
	echo "== outside: chaosuser unfenced: FAIL, as it must ($((SECONDS - t0))s)"
fi
