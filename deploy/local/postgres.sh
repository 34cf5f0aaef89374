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
  if [[ -z "$PG_SECURE" ]]; then
    echo "export BATON_POSTGRES_URL='postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$PG_PORT/$PG_DB?sslmode=disable'"
    return 0
  fi
  # verify-full: the server's certificate must chain to the test CA and name the host we dial.
  local q="sslmode=verify-full&sslrootcert=$TLS_DIR/ca.crt&passfile=$SECRETS/pgpass"
  echo "export BATON_SECURE_POSTGRES_URL='postgres://baton_runtime@localhost:$PG_PORT/$PG_DB?$q'"
  echo "export BATON_SECURE_POSTGRES_ADMIN_URL='postgres://baton_migrate@localhost:$PG_PORT/$PG_DB?$q'"
}

case "${1:-start}" in
  install) install ;;
  start) start ;;
  stop) stop fast ;;
  restart) stop fast; start ;;
  kill) kill_pg ;;
  reset) stop immediate; rm -rf "$PG_DIR" ;;
  status) if ready; then log "up on $PG_HOST:$PG_PORT"; else log "down"; exit 1; fi ;;
  env) print_env ;;
  *) echo "usage: $0 {install|start|stop|restart|kill|reset|status|env}" >&2; exit 2 ;;
esac
