#!/usr/bin/env bash
# postgres.sh - a private PostgreSQL cluster on 127.0.0.1 for Baton's tests, demo and benchmarks.
#
#   postgres.sh install   install PostgreSQL from Debian's packages if no server binaries are found
#                         (BATON_DRY_RUN=1: only say what it would install)
#   postgres.sh start     install if needed, initdb if new, start, create the role and the database
#   postgres.sh stop      fast shutdown of this cluster (and only this one)
#   postgres.sh restart   stop then start, keeping the data (chaos: a database restart)
#   postgres.sh kill      SIGKILL the postmaster of this cluster (chaos: a crashed database)
#   postgres.sh reset     stop and delete the cluster
#   postgres.sh status    exit 0 if the cluster accepts connections
#   postgres.sh env       print the environment variables the tests read
#
# A streaming standby (PG_STANDBY=sync or async; plaintext mode only), for failover tests:
#   postgres.sh standby start   start the standby, first making it with pg_basebackup from the
#                               primary if it has no data; PG_STANDBY=sync then sets the
#                               primary's synchronous_standby_names = '*' (synchronous_commit is
#                               on: a commit returns once the standby has flushed its WAL)
#   postgres.sh standby stop    fast shutdown of the standby (async: the primary goes on alone;
#                               sync: commits wait until a standby is back)
#   postgres.sh failover        SIGKILL the primary, 'pg_ctl promote' the standby (a new
#                               timeline) and reset synchronous_standby_names on it: it has no
#                               standby left. Prints the promoted node's port and timeline.
#   postgres.sh rejoin          rebuild the node that is down as the standby of the current
#                               primary (pg_basebackup anew: what it had and the new primary
#                               lacks is discarded), start it, and set the replication mode
#   postgres.sh switchover      fast shutdown of the primary (its standby receives all its WAL
#                               first), promote the standby, rejoin the old primary
#   postgres.sh primary         print the port of the node that is the primary now
#
# The two nodes are $PG_DIR/data on PG_PORT and $PG_DIR/standby on PG_STANDBY_PORT (default
# PG_PORT + 2); either may be the primary after a failover. With PG_STANDBY set, 'env' prints a
# multi-host URL (both ports, target_session_attrs=read-write), so clients follow the primary;
# 'start' and 'stop' act on both nodes; 'restart' and 'kill' on the primary.
#
# The cluster lives in its own data directory on its own port (15432 by default), so a system
# PostgreSQL on 5432 is never touched. As root the server runs as the 'postgres' user that
# Debian's package creates (PostgreSQL refuses to run as root).
#
# Secure mode, PG_SECURE=1 (postgres-secure.sh sets it, with its own directory and port): TLS
# with a server certificate from the throwaway CA of tls.sh (CN/SAN localhost, 127.0.0.1), a
# pg_hba that rejects every connection without TLS (hostnossl ... reject) and takes only
# scram-sha-256 over TLS, and two roles instead of one: baton_migrate owns the database and
# runs the DDL (Migrate), baton_runtime may only connect (the stores' RuntimeGrants give it
# select/insert/update on their tables). Passwords are random, in a pgpass file in
# $BATON_STATE_DIR/secrets (mode 600) that the URLs name (passfile=...): 'env' prints no secret.
set -euo pipefail

BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
PG_DIR="${PG_DIR:-$BATON_STATE_DIR/postgres}"
PG_HOST="${PG_HOST:-127.0.0.1}"
PG_PORT="${PG_PORT:-15432}"
PG_USER="${PG_USER:-baton}"
PG_PASSWORD="${PG_PASSWORD:-baton}"
PG_DB="${PG_DB:-baton}"
PG_START_TIMEOUT="${PG_START_TIMEOUT:-60}"
PG_SECURE="${PG_SECURE:-}"
TLS_DIR="${TLS_DIR:-$BATON_STATE_DIR/tls}"
SECRETS="${SECRETS:-$BATON_STATE_DIR/secrets}"
PG_STANDBY="${PG_STANDBY:-}"
PG_STANDBY_PORT="${PG_STANDBY_PORT:-$((PG_PORT + 2))}"

DATA="$PG_DIR/data"
RUN="$PG_DIR/run"
LOGFILE="$PG_DIR/postgres.log"

log() { printf '[postgres.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=deploy/local/tls.sh
. "$(dirname "${BASH_SOURCE[0]}")/tls.sh"

# secret NAME prints the password in $SECRETS/NAME.pass, making a random one first if needed.
secret() {
  mkdir -p "$SECRETS"; chmod 755 "$SECRETS"
  [[ -s "$SECRETS/$1.pass" ]] || (umask 077; openssl rand -hex 16 >"$SECRETS/$1.pass")
  cat "$SECRETS/$1.pass"
}

find_bin() {
  if [[ -n "${PG_BIN:-}" ]]; then [[ -x "$PG_BIN/pg_ctl" ]] && { echo "$PG_BIN"; return 0; }; return 1; fi
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
  [[ -n "$d" && -x "$d/pg_ctl" && -x "$d/initdb" && -x "$d/postgres" ]] || return 1
  echo "$d"
}

install() {
  find_bin >/dev/null && return 0
  apt_install "install PostgreSQL 13+ yourself and set PG_BIN=/path/to/bin" postgresql postgresql-contrib
  [[ -n "${BATON_DRY_RUN:-}" ]] && return 0
  find_bin >/dev/null || die "postgresql installed but no server binaries under /usr/lib/postgresql/*/bin"
}

# as_pg runs a command as the cluster's owner: 'postgres' when we are root, ourselves otherwise.
as_pg() {
  if [[ "$(id -u)" -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' user (it comes with Debian's package)"
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

ready() {
  local bin; bin="$(find_bin)" || return 1
  "$bin/pg_isready" -q -h "$PG_HOST" -p "$PG_PORT" -t 2 >/dev/null 2>&1
}

running() {
  local bin; bin="$(find_bin)" || return 1
  [[ -f "$DATA/PG_VERSION" ]] || return 1
  as_pg "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

psql_super() {
  local bin; bin="$(find_bin)"
  as_pg "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PG_PORT" -U postgres -d "${1:-postgres}" "${@:2}"
}

start() {
  install
  [[ -n "${BATON_DRY_RUN:-}" ]] && { log "dry run: would initdb and start on $PG_HOST:$PG_PORT"; return 0; }
  local bin; bin="$(find_bin)"
  if running; then log "already running on $PG_HOST:$PG_PORT ($DATA)"; return 0; fi
  if ready; then die "something this script did not start already listens on $PG_HOST:$PG_PORT; set PG_PORT"; fi
  mkdir -p "$PG_DIR" "$RUN"
  [[ "$(id -u)" -eq 0 ]] && chown postgres:postgres "$PG_DIR" "$RUN" && chmod 755 "$BATON_STATE_DIR"
  if [[ ! -f "$DATA/PG_VERSION" ]]; then
    log "initdb $DATA"
    as_pg "$bin/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 ||
      { cat "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
    cat >>"$DATA/postgresql.conf" <<EOF
# Written by deploy/local/postgres.sh.
listen_addresses = '$PG_HOST'
port = $PG_PORT
unix_socket_directories = '$RUN'
max_connections = 300
shared_buffers = 256MB
# Durable like production: benchmarks measure fsync'd commits.
fsync = on
synchronous_commit = on
max_prepared_transactions = 50
log_min_messages = warning
EOF
    # Local socket: trust (for this script); TCP: password, like a real deployment.
    cat >"$DATA/pg_hba.conf" <<EOF
local all all trust
local replication all trust
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
EOF
    if [[ -n "$PG_SECURE" ]]; then
      tls_make "$TLS_DIR" || die "could not make the test CA in $TLS_DIR"
      command install -m 600 "$TLS_DIR/server.key" "$DATA/server.key"
      command install -m 644 "$TLS_DIR/server.crt" "$DATA/server.crt"
      command install -m 644 "$TLS_DIR/ca.crt" "$DATA/ca.crt"
      [[ "$(id -u)" -eq 0 ]] && chown postgres:postgres "$DATA/server.key" "$DATA/server.crt" "$DATA/ca.crt"
      cat >>"$DATA/postgresql.conf" <<EOF
# PG_SECURE=1: TLS only (pg_hba), scram-sha-256 passwords.
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_ca_file = 'ca.crt'
ssl_min_protocol_version = 'TLSv1.2'
password_encryption = 'scram-sha-256'
EOF
      # No TLS, no entry: hostnossl rejects before any password is exchanged.
      cat >"$DATA/pg_hba.conf" <<EOF
local all all trust
hostnossl all all 0.0.0.0/0 reject
hostnossl all all ::/0 reject
hostssl all all 127.0.0.1/32 scram-sha-256
hostssl all all ::1/128 scram-sha-256
EOF
    fi
  fi
  log "starting PostgreSQL ($("$bin/postgres" --version | awk '{print $3}')) on $PG_HOST:$PG_PORT"
  local t0=$SECONDS
  as_pg "$bin/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t "$PG_START_TIMEOUT" start >/dev/null ||
    { tail -n 40 "$LOGFILE" >&2; die "PostgreSQL did not start (log: $LOGFILE)"; }
  if [[ "$(psql_super postgres -tAc 'SELECT pg_is_in_recovery()')" == t ]]; then
    log "ready after $((SECONDS - t0))s, a standby (data $DATA; log $LOGFILE)"; return 0
  fi
  psql_super postgres <<EOF
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE "$PG_USER" LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
  END IF;
END \$\$;
EOF
  if [[ -z "$(psql_super postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" ]]; then
    psql_super postgres -c "CREATE DATABASE \"$PG_DB\" OWNER \"$PG_USER\""
  fi
  if [[ -n "$PG_SECURE" ]]; then secure_roles; fi
  log "ready after $((SECONDS - t0))s (data $DATA; log $LOGFILE)"
}

# secure_roles makes the migration role (owns the database and its public schema: runs Migrate)
# and the runtime role (connect only; the stores' RuntimeGrants add table privileges), with
# random passwords written to a pgpass file. PUBLIC loses CREATE and TEMP: the runtime role can
# create nothing.
secure_roles() {
  local mig run
  mig="$(secret pg-migrate)"; run="$(secret pg-runtime)"
  psql_super postgres >/dev/null <<EOF
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'baton_migrate') THEN CREATE ROLE baton_migrate LOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'baton_runtime') THEN CREATE ROLE baton_runtime LOGIN; END IF;
END \$\$;
ALTER ROLE baton_migrate PASSWORD '$mig';
ALTER ROLE baton_runtime PASSWORD '$run' NOCREATEDB NOCREATEROLE;
ALTER DATABASE "$PG_DB" OWNER TO baton_migrate;
REVOKE ALL ON DATABASE "$PG_DB" FROM PUBLIC;
GRANT CONNECT ON DATABASE "$PG_DB" TO baton_runtime;
EOF
  psql_super "$PG_DB" >/dev/null <<EOF
ALTER SCHEMA public OWNER TO baton_migrate;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
EOF
  (umask 077
   {
     printf 'localhost:%s:%s:baton_migrate:%s\n127.0.0.1:%s:%s:baton_migrate:%s\n' "$PG_PORT" "$PG_DB" "$mig" "$PG_PORT" "$PG_DB" "$mig"
     printf 'localhost:%s:%s:baton_runtime:%s\n127.0.0.1:%s:%s:baton_runtime:%s\n' "$PG_PORT" "$PG_DB" "$run" "$PG_PORT" "$PG_DB" "$run"
   } >"$SECRETS/pgpass.tmp" && mv "$SECRETS/pgpass.tmp" "$SECRETS/pgpass")
}

stop() {
  local mode="${1:-fast}" bin
  if ! running; then log "not running"; return 0; fi
  bin="$(find_bin)"
  log "stopping ($mode)"
  as_pg "$bin/pg_ctl" -D "$DATA" -m "$mode" -w -t 60 stop >/dev/null
}

kill_pg() {
  running || { log "not running"; return 0; }
  local pid; pid="$(head -n1 "$DATA/postmaster.pid")"
  log "SIGKILL postmaster $pid"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  # Children notice the dead postmaster and exit; wait for the port to close.
  for _ in $(seq 1 50); do ready || break; sleep 0.1; done
}

print_env() {
  if [[ -z "$PG_SECURE" && -n "$PG_STANDBY" ]]; then
    # libpq's and pgx's multi-host form: each connection tries the hosts in order and keeps the
    # first that accepts writes, so a new connection finds the promoted standby.
    echo "export BATON_POSTGRES_URL='postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$PG_PORT,$PG_HOST:$PG_STANDBY_PORT/$PG_DB?sslmode=disable&target_session_attrs=read-write'"
    echo "export BATON_POSTGRES_STANDBY='$PG_STANDBY'"
    return 0
  fi
  if [[ -z "$PG_SECURE" ]]; then
    echo "export BATON_POSTGRES_URL='postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$PG_PORT/$PG_DB?sslmode=disable'"
    return 0
  fi
  # verify-full: the server's certificate must chain to the test CA and name the host we dial.
  local q="sslmode=verify-full&sslrootcert=$TLS_DIR/ca.crt&passfile=$SECRETS/pgpass"
  echo "export BATON_SECURE_POSTGRES_URL='postgres://baton_runtime@localhost:$PG_PORT/$PG_DB?$q'"
  echo "export BATON_SECURE_POSTGRES_ADMIN_URL='postgres://baton_migrate@localhost:$PG_PORT/$PG_DB?$q'"
}

# The two nodes of a primary with a standby: node 1 is the cluster above, node 2 its standby's
# copy. $PG_DIR/primary holds the number of the node that is the primary (1 until a failover).
NODE_DATA=("" "$PG_DIR/data" "$PG_DIR/standby")
NODE_PORT=("" "$PG_PORT" "$PG_STANDBY_PORT")
NODE_LOG=("" "$PG_DIR/postgres.log" "$PG_DIR/standby.log")

# on_node N CMD... runs CMD (a function of this script) with DATA, PG_PORT and LOGFILE set to node N's.
on_node() {
  local n=$1; shift
  (DATA="${NODE_DATA[$n]}"; PG_PORT="${NODE_PORT[$n]}"; LOGFILE="${NODE_LOG[$n]}"; "$@")
}
has_standby() { [[ -f "${NODE_DATA[2]}/PG_VERSION" ]]; }
other() { echo $((3 - $1)); }
# recorded_primary prints the node the last start, failover or switchover made the primary.
recorded_primary() { if [[ -s "$PG_DIR/primary" ]]; then cat "$PG_DIR/primary"; else echo 1; fi; }
record_primary() { echo "$1" >"$PG_DIR/primary.tmp" && mv "$PG_DIR/primary.tmp" "$PG_DIR/primary"; }

# role N prints primary, standby or down.
role() { on_node "$1" role_here; }
role_here() {
  if ! running || ! ready; then echo down; return 0; fi
  if [[ "$(psql_super postgres -tAc 'SELECT pg_is_in_recovery()')" == f ]]; then echo primary; else echo standby; fi
}
primary_node() {
  local n
  for n in 1 2; do [[ "$(role "$n")" == primary ]] && { echo "$n"; return 0; }; done
  return 1
}

# timeline prints the timeline the running primary writes on.
timeline() { psql_super postgres -tAc "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"; }

# replication_mode N sets, on primary node N, synchronous_standby_names for PG_STANDBY (sync: '*',
# async: empty; unset: as it is) and waits until a standby streams (sync: as the synchronous one).
replication_mode() {
  local p=$1 names="" want="async|potential|sync" st=""
  [[ "$PG_STANDBY" == sync ]] && { names='*'; want=sync; }
  if [[ -n "$PG_STANDBY" ]]; then
    on_node "$p" psql_super postgres -c "ALTER SYSTEM SET synchronous_standby_names = '$names'" \
      -c "ALTER SYSTEM SET wal_keep_size = '256MB'" -c "SELECT pg_reload_conf()" >/dev/null
  fi
  for _ in $(seq 1 300); do
    st="$(on_node "$p" psql_super postgres -tAc "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming' LIMIT 1")"
    [[ -n "$st" && "$st" =~ ^($want)$ ]] && { log "node $p (port ${NODE_PORT[$p]}) is the primary, its standby streams ($st)"; return 0; }
    sleep 0.2
  done
  die "no standby streams from node $p (state '$st', want $want)"
}

# make_standby P S replaces node S's data with a base backup of primary node P and starts it as P's standby.
make_standby() {
  local p=$1 s=$2 bin d; bin="$(find_bin)"; d="${NODE_DATA[$s]}"
  [[ "$(role "$s")" == down ]] || die "node $s is running; it must be down to be rebuilt"
  grep -q '^local replication all trust' "${NODE_DATA[$p]}/pg_hba.conf" || {
    echo 'local replication all trust' >>"${NODE_DATA[$p]}/pg_hba.conf"
    on_node "$p" psql_super postgres -c "SELECT pg_reload_conf()" >/dev/null
  }
  rm -rf "$d"
  log "pg_basebackup of node $p (port ${NODE_PORT[$p]}) into $d"
  as_pg "$bin/pg_basebackup" -h "$RUN" -p "${NODE_PORT[$p]}" -U postgres -D "$d" -R -X stream -c fast >"$PG_DIR/basebackup.log" 2>&1 ||
    { cat "$PG_DIR/basebackup.log" >&2; die "pg_basebackup failed"; }
  printf '# Written by deploy/local/postgres.sh: this node'"'"'s port.\nport = %s\n' "${NODE_PORT[$s]}" >>"$d/postgresql.conf"
  on_node "$s" start
}

# standby_start [keep]: 'keep' (start after a stop) leaves the replication mode as it was when
# PG_STANDBY is unset.
standby_start() {
  [[ -z "$PG_SECURE" ]] || die "a standby is for the plaintext cluster only"
  [[ "$PG_STANDBY" =~ ^(sync|async)$ || ( -z "$PG_STANDBY" && "${1:-}" == keep ) ]] || die "set PG_STANDBY=sync or PG_STANDBY=async"
  local p s; p="$(primary_node)" || die "no primary is running (postgres.sh start)"
  s="$(other "$p")"
  record_primary "$p"
  if [[ "$(role "$s")" == down ]]; then
    # A node that was a standby resumes; anything else (no data, an old primary) is rebuilt.
    if [[ -f "${NODE_DATA[$s]}/standby.signal" ]]; then on_node "$s" start; else make_standby "$p" "$s"; fi
  fi
  replication_mode "$p"
}

standby_stop() {
  local p s; p="$(recorded_primary)"; s="$(other "$p")"
  if [[ "$(role "$s")" == primary ]]; then die "node $s is a primary, not the standby"; fi
  on_node "$s" stop fast
}

# failover: the primary crashes (SIGKILL) and its standby is promoted. A standby that was
# stopped is started first: it replays the WAL it has and no more.
failover() {
  local p s bin tl; bin="$(find_bin)"
  p="$(primary_node)" || die "no primary is running"
  s="$(other "$p")"
  [[ -f "${NODE_DATA[$s]}/standby.signal" ]] || die "node $s is no standby: nothing to promote"
  on_node "$p" kill_pg
  [[ "$(role "$s")" == down ]] && on_node "$s" start
  log "promoting node $s (port ${NODE_PORT[$s]})"
  as_pg "$bin/pg_ctl" -D "${NODE_DATA[$s]}" -w -t 60 promote >/dev/null || die "pg_ctl promote failed"
  record_primary "$s"
  # Its standby is gone: a synchronous_standby_names inherited from the old primary would hold every commit.
  on_node "$s" psql_super postgres -c "ALTER SYSTEM SET synchronous_standby_names = ''" -c "SELECT pg_reload_conf()" >/dev/null
  tl="$(on_node "$s" timeline)"
  log "node $s is the primary on port ${NODE_PORT[$s]}, timeline $tl; node $p (port ${NODE_PORT[$p]}) is down"
  echo "promoted node $s on port ${NODE_PORT[$s]}, timeline $tl"
}

rejoin() {
  local p s; p="$(primary_node)" || die "no primary is running"
  s="$(other "$p")"
  record_primary "$p"
  if [[ "$(role "$s")" == down ]]; then make_standby "$p" "$s"; fi
  replication_mode "$p"
  echo "node $s (port ${NODE_PORT[$s]}) is the standby of node $p (port ${NODE_PORT[$p]})"
}

switchover() {
  local p s bin; bin="$(find_bin)"
  p="$(primary_node)" || die "no primary is running"
  s="$(other "$p")"
  [[ "$(role "$s")" == standby ]] || die "no standby is running"
  on_node "$p" stop fast
  as_pg "$bin/pg_ctl" -D "${NODE_DATA[$s]}" -w -t 60 promote >/dev/null || die "pg_ctl promote failed"
  record_primary "$s"
  on_node "$s" psql_super postgres -c "ALTER SYSTEM SET synchronous_standby_names = ''" -c "SELECT pg_reload_conf()" >/dev/null
  make_standby "$s" "$p"
  replication_mode "$s"
  echo "node $s (port ${NODE_PORT[$s]}) is the primary, timeline $(on_node "$s" timeline)"
}

# The plain commands, on both nodes once a standby exists.
start_cmd() {
  if ! has_standby; then start; return; fi
  local p; p="$(recorded_primary)"
  on_node "$p" start
  standby_start keep
}
stop_cmd() {
  local mode=$1
  on_node 1 stop "$mode"
  if has_standby; then on_node 2 stop "$mode"; fi
}
on_primary() { if has_standby; then on_node "$(recorded_primary)" "$@"; else "$@"; fi; }

case "${1:-start}" in
  install) install ;;
  start) start_cmd ;;
  stop) stop_cmd fast ;;
  restart) on_primary stop fast; on_primary start ;;
  kill) on_primary kill_pg ;;
  reset) stop_cmd immediate; rm -rf "$PG_DIR" ;;
  status)
    if has_standby && primary_node >/dev/null; then log "primary up on port ${NODE_PORT[$(primary_node)]}"
    elif ! has_standby && ready; then log "up on $PG_HOST:$PG_PORT"
    else log "down"; exit 1; fi ;;
  env) print_env ;;
  standby)
    case "${2:-}" in
      start) standby_start ;;
      stop) standby_stop ;;
      *) echo "usage: $0 standby {start|stop}" >&2; exit 2 ;;
    esac ;;
  failover) failover ;;
  rejoin) rejoin ;;
  switchover) switchover ;;
  primary) p="$(primary_node)" || die "no primary is running"; echo "${NODE_PORT[$p]}" ;;
  *) echo "usage: $0 {install|start|stop|restart|kill|reset|status|env|standby start|standby stop|failover|rejoin|switchover|primary}" >&2; exit 2 ;;
esac
