#!/usr/bin/env bash
# zookeeper.sh - a real standalone Apache ZooKeeper server on 127.0.0.1, the token source of
# fence/lease/zklease (ephemeral sequential node; the token is its czxid), assembled from Maven
# Central jars like kafka.sh. No tarball, no Docker.
#
#   zookeeper.sh fetch    resolve the server's jars once into the cache (needs mvn, reaches Maven Central)
#   zookeeper.sh start    fetch if needed, start, wait until it serves (answers srvr)
#   zookeeper.sh stop     SIGTERM the server this script started; SIGKILL after 10 s
#   zookeeper.sh kill     SIGKILL the server this script started (a crashed server)
#   zookeeper.sh restart  stop then start, keeping the data
#   zookeeper.sh reset    stop and delete the data
#   zookeeper.sh status   exit 0 if the server answers on $ZOOKEEPER_HOST:$ZOOKEEPER_PORT
#   zookeeper.sh env      print the environment variables the tests read
#
# Version: ZooKeeper 3.9.5, the newest release whose dependencies Maven Central serves here.
# tickTime is 500 ms so that sessions may be as short as 1 s (minSessionTimeout = 2 ticks): the
# zombie tests freeze a holder past its session. Every setting is an environment variable.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

ZOOKEEPER_VERSION="${ZOOKEEPER_VERSION:-3.9.5}"
BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
ZOOKEEPER_DIR="${ZOOKEEPER_DIR:-$BATON_STATE_DIR/zookeeper}"
BATON_CACHE_DIR="${BATON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/baton}"
ZOOKEEPER_LIBS="${ZOOKEEPER_LIBS:-$BATON_CACHE_DIR/zookeeper-$ZOOKEEPER_VERSION}"
ZOOKEEPER_HOST="${ZOOKEEPER_HOST:-127.0.0.1}"
ZOOKEEPER_PORT="${ZOOKEEPER_PORT:-12181}"
ZOOKEEPER_HEAP_OPTS="${ZOOKEEPER_HEAP_OPTS:--Xms64m -Xmx256m}"
ZOOKEEPER_START_TIMEOUT="${ZOOKEEPER_START_TIMEOUT:-60}"
JAVA="${JAVA:-${JAVA_HOME:+$JAVA_HOME/bin/}java}"
MVN="${MVN:-mvn}"

CONF="$ZOOKEEPER_DIR/zoo.cfg"
DATA="$ZOOKEEPER_DIR/data"
LOGFILE="$ZOOKEEPER_DIR/zookeeper.out"
PIDFILE="$ZOOKEEPER_DIR/zookeeper.pid"

log() { printf '[zookeeper.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_java() {
  command -v "$JAVA" >/dev/null 2>&1 ||
    die "java not found. ZooKeeper $ZOOKEEPER_VERSION needs Java 11+: on Debian 'apt-get install openjdk-17-jre-headless', or set JAVA=/path/to/java"
}

fetch() {
  [[ -f "$ZOOKEEPER_LIBS/.complete" ]] && return 0
  command -v "$MVN" >/dev/null 2>&1 ||
    die "mvn not found; it is needed once to fetch ZooKeeper's jars from Maven Central: 'apt-get install maven', or set MVN=/path/to/mvn"
  local tmp="$ZOOKEEPER_LIBS.partial" t0=$SECONDS
  rm -rf "$tmp"; mkdir -p "$tmp"
  log "fetching org.apache.zookeeper:zookeeper:$ZOOKEEPER_VERSION from Maven Central"
  "$MVN" -B -q -f "$HERE/zookeeper/pom.xml" \
    -Dzookeeper.version="$ZOOKEEPER_VERSION" -Dzookeeper.libs.dir="$tmp" \
    dependency:copy-dependencies >&2 || die "mvn could not fetch the server's jars (see above)"
  [[ -f "$tmp/zookeeper-$ZOOKEEPER_VERSION.jar" ]] || die "zookeeper-$ZOOKEEPER_VERSION.jar missing"
  [[ -f "$tmp/zookeeper-jute-$ZOOKEEPER_VERSION.jar" ]] || die "zookeeper-jute-$ZOOKEEPER_VERSION.jar missing"
  compgen -G "$tmp/slf4j-simple-*.jar" >/dev/null || die "SLF4J binding missing"
  compgen -G "$tmp/metrics-core-*.jar" >/dev/null || die "metrics-core missing (the server cannot start without it)"
  compgen -G "$tmp/snappy-java-*.jar" >/dev/null || die "snappy-java missing (the server cannot start without it)"
  touch "$tmp/.complete"
  rm -rf "$ZOOKEEPER_LIBS"; mv "$tmp" "$ZOOKEEPER_LIBS"
  log "fetched $(compgen -G "$ZOOKEEPER_LIBS/*.jar" | wc -l) jars, $(du -sh "$ZOOKEEPER_LIBS" | cut -f1), in $((SECONDS - t0))s -> $ZOOKEEPER_LIBS"
}

write_config() {
  mkdir -p "$DATA"
  cat >"$CONF" <<CFG
# Written by deploy/local/zookeeper.sh. Standalone, one server.
tickTime=500
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir=$DATA
clientPortAddress=$ZOOKEEPER_HOST
clientPort=$ZOOKEEPER_PORT
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr
CFG
}

# True once the server serves requests: it answers the four-letter word srvr with its version.
# (ruok is not enough: a process whose server thread died still answers imok.)
ruok() {
  # shellcheck disable=SC2016
  timeout 2 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf srvr >&3
    grep -q "^Zookeeper version:" <&3' "$ZOOKEEPER_HOST" "$ZOOKEEPER_PORT" 2>/dev/null
}

running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "ZooKeeperServerMain $CONF" || return 1
  echo "$pid"
}

start() {
  local pid
  if pid="$(running_pid)"; then log "already running (pid $pid) on $ZOOKEEPER_HOST:$ZOOKEEPER_PORT"; return 0; fi
  rm -f "$PIDFILE"
  need_java
  fetch
  ruok && die "something this script did not start answers on $ZOOKEEPER_HOST:$ZOOKEEPER_PORT; set ZOOKEEPER_PORT"
  write_config
  log "starting ZooKeeper $ZOOKEEPER_VERSION on $ZOOKEEPER_HOST:$ZOOKEEPER_PORT"
  local t0=$SECONDS
  # shellcheck disable=SC2086  # word splitting of ZOOKEEPER_HEAP_OPTS is intended
  nohup "$JAVA" $ZOOKEEPER_HEAP_OPTS -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dorg.slf4j.simpleLogger.defaultLogLevel="${ZOOKEEPER_LOG_LEVEL:-info}" \
    -Dzookeeper.jmx.log4j.disable=true \
    -cp "$ZOOKEEPER_LIBS/*" org.apache.zookeeper.server.ZooKeeperServerMain "$CONF" \
    >>"$LOGFILE" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PIDFILE"
  until ruok; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$LOGFILE" >&2; rm -f "$PIDFILE"; die "zookeeper exited during start-up (log: $LOGFILE)"
    fi
    if (( SECONDS - t0 >= ZOOKEEPER_START_TIMEOUT )); then
      tail -n 40 "$LOGFILE" >&2; stop TERM || true; die "not ready after ${ZOOKEEPER_START_TIMEOUT}s"
    fi
    sleep 0.1
  done
  log "ready after $((SECONDS - t0))s (pid $pid; log $LOGFILE)"
}

stop() {
  local pid sig="${1:-TERM}"
  if ! pid="$(running_pid)"; then log "not running"; rm -f "$PIDFILE"; return 0; fi
  kill -"$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop TERM ;;
  kill) stop KILL ;;
  restart) stop TERM; start ;;
  reset) stop TERM; rm -rf "$DATA" ;;
  status) if ruok; then log "up on $ZOOKEEPER_HOST:$ZOOKEEPER_PORT"; else log "down"; exit 1; fi ;;
  env) echo "export BATON_ZOOKEEPER_ADDR='$ZOOKEEPER_HOST:$ZOOKEEPER_PORT'" ;;
  *) echo "usage: $0 {fetch|start|stop|kill|restart|reset|status|env}" >&2; exit 2 ;;
esac
