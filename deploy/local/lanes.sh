#!/usr/bin/env bash
# lanes.sh LANE_A_TARGET LANE_B_TARGET [LANE_C_TARGET [LANE_D_TARGET]] - run make targets at
# once, each against its own set of services, and exit non-zero if any failed. 'make test' uses
# it: most of the suite's time is spent waiting (chaos runs sleeping through their faults,
# restarts, rebalances, failovers), so the wait-bound tests run in the other lanes beside the
# rest in lane A.
#
# Lane A uses the services already up and exported (with-services.sh runs this script). Every
# other lane gets a set of its own, started and stopped by a with-services.sh of its own: lane B's
# ports LANES_OFFSET (default 1000) above lane A's, lane C's twice that, lane D's three times,
# their state under $BATON_STATE_DIR/lane-b, lane-c and lane-d. Their tests may restart their
# broker and database (the chaos runs do); lane A never sees it. Lane C also gets three PostgreSQL shard clusters
# (BATON_PG_SHARDS=3, postgres-shards.sh) for the chaos run with a shard outage. Their output
# is streamed with a "B| ", "C| " or "D| " prefix and each lane's is kept whole in
# $BATON_STATE_DIR/lane-X.log; when a lane fails, the end of the output repeats its failures
# (the failing tests' lines) so that a reader of the last lines sees what failed.
# lanes.sh down - stop lanes B's, C's and D's services (a safety net after a failure;
# with-services.sh stops them).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
off="${LANES_OFFSET:-1000}"
MAKE="${MAKE:-make}"
state="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"

# lane_env N LETTER: the environment of the lane N offsets above lane A.
lane_env() {
  local o=$(($1 * off))
  export BATON_STATE_DIR="$state/lane-$2"
  export KAFKA_PORT=$((${KAFKA_PORT:-19092} + o))
  export KAFKA_CONTROLLER_PORT=$((${KAFKA_CONTROLLER_PORT:-19093} + o))
  export KAFKA_SECURE_PORT=$((KAFKA_PORT + 2))
  export PG_PORT=$((${PG_PORT:-15432} + o))
  export PG_SECURE_PORT=$((${PG_SECURE_PORT:-15433} + o))
  export PG_REPLICA_PORT=$((${PG_REPLICA_PORT:-15435} + o))
  export REDIS_PORT=$((${REDIS_PORT:-16379} + o))
  export ETCD_PORT=$((${ETCD_PORT:-12379} + o))
  export ETCD_PEER_PORT=$((${ETCD_PEER_PORT:-12380} + o))
  export ZOOKEEPER_PORT=$((${ZOOKEEPER_PORT:-12181} + o))
  export PG_SHARD_PORT=$((${PG_SHARD_PORT:-15441} + o))
  if [[ "$2" == c ]]; then export BATON_PG_SHARDS=3; fi # the shard-outage chaos run's clusters
  # The chaos package's three-broker cluster (started by the tests that need it).
  export BATON_CHAOS_CLUSTER_PORT=$((${BATON_CHAOS_CLUSTER_PORT:-29092} + o))
}

if [[ "${1:-}" == down && $# -eq 1 ]]; then
  rc=0
  (lane_env 1 b; exec "$HERE/down.sh") || rc=$?
  (lane_env 2 c; exec "$HERE/down.sh") || rc=$?
  (lane_env 3 d; exec "$HERE/down.sh") || rc=$?
  exit $rc
fi
[[ $# -ge 2 && $# -le 4 ]] || { echo "usage: $0 LANE_A_TARGET LANE_B_TARGET [LANE_C_TARGET [LANE_D_TARGET]] | $0 down" >&2; exit 2; }
args=("$@") a_target=$1
letters=(b c d)

lane() {
  lane_env "$1" "$2"
  mkdir -p "$BATON_STATE_DIR"
  exec "$HERE/with-services.sh" "$MAKE" --no-print-directory "$3"
}

start=$(date +%s)
mkdir -p "$state"
pids=() names=()
for ((i = 1; i < $#; i++)); do
  l=${letters[i-1]} target=${args[i]}
  U=${l^^}
  (lane "$i" "$l" "$target") > >(tee "$state/lane-$l.log" | sed -u "s/^/$U| /") 2>&1 &
  pids+=($!) names+=("$U ($target)")
done
# Each lane's with-services.sh stops its services when it ends, also when this script is interrupted.
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' INT TERM
a_status=0
"$MAKE" --no-print-directory "$a_target" > >(tee "$state/lane-a.log") 2>&1 || a_status=$?
echo "== lane A ($a_target) exited $a_status after $(($(date +%s) - start))s; waiting for ${names[*]}"
ok=$a_status
failed=()
[[ $a_status -eq 0 ]] || failed+=(a)
for i in "${!pids[@]}"; do
  s=0
  wait "${pids[i]}" || s=$?
  # The lane's own length: its log's last write (this loop only sees it once lane A is done).
  own=$(($(stat -c %Y "$state/lane-${letters[i]}.log" 2>/dev/null || date +%s) - start))
  echo "== lane ${names[i]} exited $s after ${own}s"
  [[ $s -eq 0 ]] || { ok=1; failed+=("${letters[i]}"); }
done
wait # the prefixing seds: the last of the lanes' output
# failures L: what lane L's log says failed: the failing tests' messages (file:line), a panic, a
# surviving mutant, a failed make step (the last 40 of them), then the names of the failing tests,
# last, so that a reader of only the output's last lines sees them.
failures() {
  local log="$state/lane-$1.log"
  grep -E -e '^panic:|_test\.go:[0-9]+:|SURVIVED| [1-9][0-9]* survived|Error [0-9]+$' "$log" 2>/dev/null | tail -n 40 | sed "s/^/${1^^}! /"
  grep -E -e '--- FAIL|^FAIL' "$log" 2>/dev/null | sed "s/^/${1^^}! /"
}
for l in "${failed[@]}"; do
  echo "== lane ${l^^} failed (its whole output: $state/lane-$l.log):"
  failures "$l"
done
[[ $ok -eq 0 ]]
