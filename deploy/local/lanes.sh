#!/usr/bin/env bash
# lanes.sh LANE_A_TARGET LANE_B_TARGET - run two make targets at once, each against its own set of
# services, and exit non-zero if either failed. 'make test' uses it: most of the suite's time is
# spent waiting (chaos runs sleeping through their faults, restarts, rebalances), so the
# wait-bound packages run in lane B beside the rest in lane A.
#
# Lane A uses the services already up and exported (with-services.sh runs this script). Lane B
# gets a second set of its own, started and stopped by a with-services.sh of its own: every port
# LANES_OFFSET (default 1000) above lane A's, its state under $BATON_STATE_DIR/lane-b. Lane B's
# tests may restart its broker and database (the chaos runs do); lane A never sees it. Lane B's
# output is streamed with a "B| " prefix.
#
# lanes.sh down - stop lane B's services (a safety net after a failure; with-services.sh stops them).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
off="${LANES_OFFSET:-1000}"
MAKE="${MAKE:-make}"
state="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"

lane_b_env() {
  export BATON_STATE_DIR="$state/lane-b"
  export KAFKA_PORT=$((${KAFKA_PORT:-19092} + off))
  export KAFKA_CONTROLLER_PORT=$((${KAFKA_CONTROLLER_PORT:-19093} + off))
  export KAFKA_SECURE_PORT=$((KAFKA_PORT + 2))
  export PG_PORT=$((${PG_PORT:-15432} + off))
  export PG_SECURE_PORT=$((${PG_SECURE_PORT:-15433} + off))
  export PG_REPLICA_PORT=$((${PG_REPLICA_PORT:-15435} + off))
  export REDIS_PORT=$((${REDIS_PORT:-16379} + off))
  export ETCD_PORT=$((${ETCD_PORT:-12379} + off))
  export ETCD_PEER_PORT=$((${ETCD_PEER_PORT:-12380} + off))
  export ZOOKEEPER_PORT=$((${ZOOKEEPER_PORT:-12181} + off))
}

if [[ "${1:-}" == down && $# -eq 1 ]]; then lane_b_env; exec "$HERE/down.sh"; fi
[[ $# -eq 2 ]] || { echo "usage: $0 LANE_A_TARGET LANE_B_TARGET | $0 down" >&2; exit 2; }
a_target=$1 b_target=$2

lane_b() {
  lane_b_env
  mkdir -p "$BATON_STATE_DIR"
  exec "$HERE/with-services.sh" "$MAKE" --no-print-directory "$b_target"
}

t0=$SECONDS
(lane_b) > >(sed -u 's/^/B| /') 2>&1 &
b_pid=$!
# Lane B's with-services.sh stops its services when it ends, also when this script is interrupted.
trap 'kill -TERM "$b_pid" 2>/dev/null || true; wait "$b_pid" 2>/dev/null || true' INT TERM
a_status=0
"$MAKE" --no-print-directory "$a_target" || a_status=$?
echo "== lane A ($a_target) exited $a_status after $((SECONDS - t0))s; waiting for lane B ($b_target)"
b_status=0
wait "$b_pid" || b_status=$?
wait # the prefixing sed: the last of lane B's output
echo "== lane B ($b_target) exited $b_status after $((SECONDS - t0))s"
[[ $a_status -eq 0 && $b_status -eq 0 ]]
