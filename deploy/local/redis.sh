#!/usr/bin/env bash
# redis.sh - a private Redis on 127.0.0.1, for the chaos harness's baseline (the naive lock from
# the seeds: SET NX PX + compare-and-delete, so the checker can show what a lock lets through) and
# the Redis sink's conformance tests (fence/redisfence), which accept this server's lack of an
# append-only file explicitly; its durability test starts a redis-server of its own.
#
#   redis.sh install | start | stop | kill | status | env
set -euo pipefail

BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
REDIS_DIR="${REDIS_DIR:-$BATON_STATE_DIR/redis}"
REDIS_HOST="${REDIS_HOST:-127.0.0.1}"
REDIS_PORT="${REDIS_PORT:-16379}"
PIDFILE="$REDIS_DIR/redis.pid"

log() { printf '[redis.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install() {
  command -v redis-server >/dev/null 2>&1 && return 0
  apt_install "install Redis 6+ yourself (redis-server and redis-cli on PATH)" redis-server
  [[ -n "${BATON_DRY_RUN:-}" ]] && return 0
  command -v redis-server >/dev/null 2>&1 || die "redis-server still not found after install"
}

running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  grep -q redis-server "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

ping() { [[ "$(timeout 2 redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]; }

start() {
  local pid
  if pid="$(running_pid)"; then log "already running (pid $pid)"; return 0; fi
  install
  [[ -n "${BATON_DRY_RUN:-}" ]] && { log "dry run: would start on $REDIS_HOST:$REDIS_PORT"; return 0; }
  ping && die "something this script did not start answers on $REDIS_HOST:$REDIS_PORT; set REDIS_PORT"
  mkdir -p "$REDIS_DIR"
  redis-server --bind "$REDIS_HOST" --port "$REDIS_PORT" --daemonize yes --pidfile "$PIDFILE" \
    --dir "$REDIS_DIR" --save '' --appendonly no --logfile "$REDIS_DIR/redis.log" --protected-mode no
  for _ in $(seq 1 100); do ping && { log "ready on $REDIS_HOST:$REDIS_PORT"; return 0; }; sleep 0.1; done
  die "redis did not answer (log: $REDIS_DIR/redis.log)"
}

stop() {
  local pid sig="${1:-TERM}"
  if ! pid="$(running_pid)"; then log "not running"; return 0; fi
  kill -"$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  install) install ;;
  start) start ;;
  stop) stop TERM ;;
  kill) stop KILL ;;
  status) if ping; then log "up on $REDIS_HOST:$REDIS_PORT"; else log "down"; exit 1; fi ;;
  env) echo "export BATON_REDIS_ADDR='$REDIS_HOST:$REDIS_PORT'" ;;
  *) echo "usage: $0 {install|start|stop|kill|status|env}" >&2; exit 2 ;;
esac
