#!/usr/bin/env bash
# etcd.sh - a private single-member etcd on 127.0.0.1, the token source of fence/lease/etcdlease
# (lease + key; the token is the key's create revision). Installed from Debian's etcd-server
# package; the data directory is private and the ports are not etcd's defaults, so a system etcd
# is never touched.
#
#   etcd.sh install | start | stop | kill | status | env
set -euo pipefail

BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
ETCD_DIR="${ETCD_DIR:-$BATON_STATE_DIR/etcd}"
ETCD_HOST="${ETCD_HOST:-127.0.0.1}"
ETCD_PORT="${ETCD_PORT:-12379}"
ETCD_PEER_PORT="${ETCD_PEER_PORT:-12380}"
ETCD_START_TIMEOUT="${ETCD_START_TIMEOUT:-30}"
PIDFILE="$ETCD_DIR/etcd.pid"

log() { printf '[etcd.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

install() {
  command -v etcd >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || die "no etcd and no apt-get; install etcd 3.4+ yourself"
  local SUDO=""; [[ "$(id -u)" -eq 0 ]] || SUDO="sudo"
  log "installing etcd-server from Debian's packages"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update failed"
  local policy=/usr/sbin/policy-rc.d created=""
  if [[ ! -e "$policy" ]]; then printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null; $SUDO chmod +x "$policy"; created=1; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >&2 ||
    { [[ -n "$created" ]] && $SUDO rm -f "$policy"; die "apt-get install etcd-server failed"; }
  [[ -n "$created" ]] && $SUDO rm -f "$policy"
  command -v etcd >/dev/null 2>&1 || die "etcd still not found after install"
}

running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--data-dir $ETCD_DIR/data" || return 1
  echo "$pid"
}

# True once the member answers /health with "true" (it has a leader and serves reads).
ping() {
  # shellcheck disable=SC2016
  timeout 2 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n" "$0" >&3
    grep -q "\"health\":\"true\"" <&3' "$ETCD_HOST" "$ETCD_PORT" 2>/dev/null
}

start() {
  local pid
  if pid="$(running_pid)"; then log "already running (pid $pid)"; return 0; fi
  rm -f "$PIDFILE"
  install
  ping && die "something this script did not start answers on $ETCD_HOST:$ETCD_PORT; set ETCD_PORT"
  mkdir -p "$ETCD_DIR"
  local t0=$SECONDS url="http://$ETCD_HOST:$ETCD_PORT" peer="http://$ETCD_HOST:$ETCD_PEER_PORT"
  nohup etcd --name baton --data-dir "$ETCD_DIR/data" \
    --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "baton=$peer" --initial-cluster-state new \
    --logger zap --log-outputs stderr \
    >>"$ETCD_DIR/etcd.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PIDFILE"
  until ping; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$ETCD_DIR/etcd.log" >&2; rm -f "$PIDFILE"; die "etcd exited during start-up (log: $ETCD_DIR/etcd.log)"
    fi
    if (( SECONDS - t0 >= ETCD_START_TIMEOUT )); then
      tail -n 40 "$ETCD_DIR/etcd.log" >&2; stop TERM || true; die "not ready after ${ETCD_START_TIMEOUT}s"
    fi
    sleep 0.1
  done
  log "ready on $ETCD_HOST:$ETCD_PORT after $((SECONDS - t0))s (pid $pid; log $ETCD_DIR/etcd.log)"
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
  install) install ;;
  start) start ;;
  stop) stop TERM ;;
  kill) stop KILL ;;
  status) if ping; then log "up on $ETCD_HOST:$ETCD_PORT"; else log "down"; exit 1; fi ;;
  env) echo "export BATON_ETCD_ENDPOINTS='$ETCD_HOST:$ETCD_PORT'" ;;
  *) echo "usage: $0 {install|start|stop|kill|status|env}" >&2; exit 2 ;;
esac
