#!/usr/bin/env bash
# kafka.sh - a real single-node Apache Kafka broker (KRaft, broker+controller in one JVM),
# assembled from Maven Central jars. No tarball, no Docker.
#
#   kafka.sh install  install Java 17+ (and Maven, until the jars are cached) from Debian's packages
#                     when missing; fast when they are there. BATON_DRY_RUN=1 only says what it would do
#   kafka.sh fetch    resolve the broker's jars once into the cache (needs mvn, reaches Maven Central)
#   kafka.sh start    install and fetch if needed, format storage if new, start, wait until it answers
#   kafka.sh stop     controlled shutdown (SIGTERM) of the broker this script started; SIGKILL after 30 s
#   kafka.sh kill     SIGKILL the broker this script started (chaos: a crashed broker)
#   kafka.sh restart  stop then start, keeping the data (chaos: a broker restart)
#   kafka.sh reset    stop and delete the data (the next start is a brand-new cluster)
#   kafka.sh status   exit 0 if the broker answers on $KAFKA_HOST:$KAFKA_PORT
#   kafka.sh env      print the environment variables the tests read
#   kafka.sh version  print the Kafka version, log4j version and jar cache this setting runs
#   kafka.sh logfile  print the broker's log file (chaos faults read the group coordinator's loads there)
#   kafka.sh tool NAME [ARGS]  run one of Kafka's command-line tools, as the tarball's bin/NAME would:
#                     kafka-consumer-groups.sh, kafka-topics.sh, kafka-console-consumer.sh,
#                     kafka-console-producer.sh, kafka-get-offsets.sh. Their jars (kafka-tools) are
#                     fetched once into a cache of their own; --bootstrap-server defaults to this broker.
#                     e.g. deploy/local/kafka.sh tool kafka-consumer-groups.sh --describe --group twins
#
# Cluster mode, KAFKA_NODES=3 (any N >= 2): N brokers on loopback, one JVM each, every one a
# broker and a KRaft controller (combined roles, a static quorum of N voters), internal topics
# replicated to min(N, 3) nodes, for the chaos faults that need a group coordinator that can
# move (internal/operator/chaos: coordinator-kill). Node i (1..N) listens on KAFKA_CLUSTER_PORT+2(i-1)
# (default 29092, 29094, 29096) with its controller on the next port, keeps its data in
# $BATON_STATE_DIR/kafka-cluster/node-i, and has node.id i. start, stop, kill, restart, reset,
# status, env and logfile act on every node (env prints all N addresses in BATON_KAFKA_BROKERS);
# one node at a time:
#   kafka.sh node-start N | node-stop N | node-kill N | node-restart N | logfile N
# Secure mode is single-node only.
#
# Secure mode, BATON_SECURE=1: a second listener, SASL_SSL on $KAFKA_SECURE_PORT, next to the
# plaintext one: TLS with a certificate from a throwaway CA (tls.sh, in $BATON_STATE_DIR/tls),
# mutual TLS (ssl.client.auth=required), SASL/SCRAM-SHA-512 with two users created by Kafka's own
# storage tool at format time (baton-admin, a super user; baton-runtime, which has no ACL until a
# test grants one), and the ACL authorizer (StandardAuthorizer, deny when no ACL matches). The
# plaintext and controller listeners stay for the rest of the suite and the broker itself: their
# principal, ANONYMOUS, is a super user. Passwords are random, in $BATON_STATE_DIR/secrets (mode
# 600); 'env' prints the files' paths, never the passwords. Turning the mode on for an existing
# data directory needs 'reset' first (SCRAM users are created when the storage is formatted).
#
# Version: KAFKA_VERSION, default 4.3.1, the release of KIP-1251 (per-partition assignment
# epochs for KIP-848 groups), which the consumer's AssignmentEpochs source needs to prove
# ownership; the whole suite runs on it in the classic protocol and make test-kip848 repeats the
# consumer's tests and a chaos run in the consumer protocol on the same broker. 4.1.1 (SLF4J 1.7 +
# log4j 2.24.3), the release the scripts were first written for, still works. Every
# 4.x release on Maven Central works: LOG4J_VERSION defaults to the log4j2 line the release ships,
# each version's jars are cached in their own directory ($BATON_CACHE_DIR/kafka-V-log4j-L), and a
# data directory remembers the version that formatted it: starting another version on it is
# refused ('reset' first, or another BATON_STATE_DIR).
#
# Every setting is an environment variable (defaults below). The script only ever signals the pid
# it recorded itself, and only if that process is still the broker it started.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

KAFKA_VERSION="${KAFKA_VERSION:-4.3.1}"
case "$KAFKA_VERSION" in
  4.0.*|4.1.*) default_log4j=2.24.3 ;;
  4.2.*|4.3.*) default_log4j=2.25.4 ;;
  *)           default_log4j=2.25.5 ;;
esac
LOG4J_VERSION="${LOG4J_VERSION:-$default_log4j}"
BATON_STATE_DIR="${BATON_STATE_DIR:-${TMPDIR:-/tmp}/baton-local}"
KAFKA_DIR="${KAFKA_DIR:-$BATON_STATE_DIR/kafka}"
BATON_CACHE_DIR="${BATON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/baton}"
KAFKA_LIBS="${KAFKA_LIBS:-$BATON_CACHE_DIR/kafka-$KAFKA_VERSION-log4j-$LOG4J_VERSION}"
KAFKA_HOST="${KAFKA_HOST:-127.0.0.1}"
KAFKA_PORT="${KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-19093}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"
KAFKA_LOG_LEVEL="${KAFKA_LOG_LEVEL:-INFO}"
KAFKA_NODES="${KAFKA_NODES:-1}"
KAFKA_CLUSTER_PORT="${KAFKA_CLUSTER_PORT:-29092}"
# Set per node by cluster mode (not meant to be set by hand): this node's id, the static quorum's
# voters (empty: a single --standalone controller), the internal topics' replication factor.
KAFKA_NODE_ID="${KAFKA_NODE_ID:-1}"
KAFKA_VOTERS="${KAFKA_VOTERS:-}"
KAFKA_RF="${KAFKA_RF:-1}"
BATON_SECURE="${BATON_SECURE:-}"
KAFKA_SECURE_PORT="${KAFKA_SECURE_PORT:-$((KAFKA_PORT + 2))}"
TLS_DIR="${TLS_DIR:-$BATON_STATE_DIR/tls}"
SECRETS="${SECRETS:-$BATON_STATE_DIR/secrets}"
# JAVA or JAVA_HOME pins the JVM; otherwise 'java' on PATH if it is 17+, else the newest Debian
# OpenJDK 17+ under JVM_DIR.
JAVA="${JAVA:-${JAVA_HOME:+$JAVA_HOME/bin/java}}"
JVM_DIR="${JVM_DIR:-/usr/lib/jvm}"
MVN="${MVN:-mvn}"
# What to install when Java is missing: Debian 12 has openjdk-17, Debian 13 starts at 21.
JAVA_PACKAGES="${JAVA_PACKAGES:-openjdk-17-jre-headless|openjdk-21-jre-headless|default-jre-headless}"

CONF="$KAFKA_DIR/config"
DATA="$KAFKA_DIR/data"
LOGS="$KAFKA_DIR/logs"
PIDFILE="$KAFKA_DIR/kafka.pid"

log() { printf '[kafka.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=deploy/local/lib.sh
. "$HERE/lib.sh"
# shellcheck source=deploy/local/tls.sh
. "$HERE/tls.sh"

# secret NAME prints the password in $SECRETS/NAME.pass, making a random one first if needed.
secret() {
  mkdir -p "$SECRETS"; chmod 755 "$SECRETS"
  [[ -s "$SECRETS/$1.pass" ]] || (umask 077; openssl rand -hex 16 >"$SECRETS/$1.pass")
  cat "$SECRETS/$1.pass"
}

# java_major JAVA prints the JVM's major version ("17"), or fails if it does not run.
java_major() {
  local v
  v="$("$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)" || return 1
  [[ "$v" =~ ^[0-9]+$ ]] || return 1
  echo "$v"
}

# find_java prints a Java 17+ to run the broker with, or fails. An explicit JAVA/JAVA_HOME is
# never second-guessed: if it is not 17+ that is an error, not a reason to install another.
find_java() {
  local j v
  if [[ -n "$JAVA" ]]; then
    v="$(java_major "$JAVA")" || die "JAVA=$JAVA does not run"
    [[ "$v" -ge 17 ]] || die "JAVA=$JAVA is Java $v; Kafka 4.x needs Java 17+"
    echo "$JAVA"; return 0
  fi
  if j="$(command -v java)" && v="$(java_major "$j")" && [[ "$v" -ge 17 ]]; then echo "$j"; return 0; fi
  for j in $(compgen -G "$JVM_DIR/java-*-openjdk-*/bin/java" | sort -V -r); do
    if v="$(java_major "$j")" && [[ "$v" -ge 17 ]]; then echo "$j"; return 0; fi
  done
  return 1
}

jars_cached() { [[ -f "$KAFKA_LIBS/.complete" ]]; }

# install makes sure Java 17+ is there, and Maven while the broker's jars are not yet cached,
# installing what is missing from Debian's packages in one apt-get run.
install() {
  local missing=() what=()
  find_java >/dev/null || { missing+=("$JAVA_PACKAGES"); what+=("Java 17+"); }
  jars_cached || command -v "$MVN" >/dev/null 2>&1 || { missing+=(maven); what+=("Maven (to fetch Kafka's jars once)"); }
  [[ ${#missing[@]} -eq 0 ]] && return 0
  log "not found: ${what[*]}"
  apt_install "install a Java 17+ runtime (and Maven 3, once, to fetch Kafka's jars) and set JAVA=/path/to/java, MVN=/path/to/mvn" "${missing[@]}"
  [[ -n "${BATON_DRY_RUN:-}" ]] && return 0
  find_java >/dev/null || die "installed ${missing[*]} but found no Java 17+ (on PATH or under $JVM_DIR)"
  jars_cached || command -v "$MVN" >/dev/null 2>&1 || die "installed maven but there is still no $MVN"
}

# The command-line tools' jars: a cache apart from the broker's, fetched only when a tool runs.
TOOLS_LIBS="${KAFKA_TOOLS_LIBS:-$KAFKA_LIBS-tools}"

# tool_class NAME prints the main class of the tarball's bin/NAME.
tool_class() {
  case "$1" in
    kafka-consumer-groups.sh) echo org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
    kafka-topics.sh) echo org.apache.kafka.tools.TopicCommand ;;
    kafka-console-consumer.sh) echo org.apache.kafka.tools.consumer.ConsoleConsumer ;;
    kafka-console-producer.sh) echo org.apache.kafka.tools.ConsoleProducer ;;
    kafka-get-offsets.sh) echo org.apache.kafka.tools.GetOffsetShell ;;
    *) return 1 ;;
  esac
}

# tool NAME ARGS... runs a command-line tool against this broker (unless --bootstrap-server is given).
tool() {
  local name="${1:-}" class; shift || true
  class="$(tool_class "$name")" || die "unknown tool '$name': kafka-consumer-groups.sh, kafka-topics.sh, kafka-console-consumer.sh, kafka-console-producer.sh or kafka-get-offsets.sh"
  local java; java="$(find_java)" || { install; java="$(find_java 2>/dev/null || true)"; }
  if [[ ! -f "$TOOLS_LIBS/.complete" ]]; then
    command -v "$MVN" >/dev/null 2>&1 || install_maven_for_tools
    if [[ -n "${BATON_DRY_RUN:-}" ]]; then
      log "dry run: would fetch org.apache.kafka:kafka-tools:$KAFKA_VERSION into $TOOLS_LIBS and run $class"; return 0
    fi
    local tmp="$TOOLS_LIBS.partial"
    rm -rf "$tmp"; mkdir -p "$tmp"
    log "fetching org.apache.kafka:kafka-tools:$KAFKA_VERSION from Maven Central (once)"
    "$MVN" -B -q -f "$HERE/kafka/tools-pom.xml" -Dkafka.version="$KAFKA_VERSION" -Dlog4j.version="$LOG4J_VERSION" \
      -Dkafka.libs.dir="$tmp" dependency:copy-dependencies >&2 || die "mvn could not fetch kafka-tools (see above)"
    compgen -G "$tmp/kafka-tools-$KAFKA_VERSION.jar" >/dev/null || die "kafka-tools-$KAFKA_VERSION.jar missing"
    printf 'status = warn\nappender.console.type = Console\nappender.console.name = STDERR\nappender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\nappender.console.layout.pattern = [%%d] %%p %%m (%%c)%%n\nrootLogger.level = WARN\nrootLogger.appenderRef.stderr.ref = STDERR\n' >"$tmp/log4j2.properties"
    touch "$tmp/.complete"
    rm -rf "$TOOLS_LIBS"; mv "$tmp" "$TOOLS_LIBS"
  elif [[ -n "${BATON_DRY_RUN:-}" ]]; then
    log "dry run: would run $class"; return 0
  fi
  local args=("$@")
  [[ " ${args[*]} " == *" --bootstrap-server "* ]] || args=(--bootstrap-server "$KAFKA_HOST:$KAFKA_PORT" "${args[@]}")
  exec "$java" -Xmx256m -Dlog4j2.configurationFile="$TOOLS_LIBS/log4j2.properties" -cp "$TOOLS_LIBS/*" "$class" "${args[@]}"
}

# install_maven_for_tools installs Maven when the tools' jars are to be fetched and there is none.
install_maven_for_tools() {
  apt_install "install Maven 3 (to fetch Kafka's command-line tools once) and set MVN=/path/to/mvn" maven
  [[ -n "${BATON_DRY_RUN:-}" ]] || command -v "$MVN" >/dev/null 2>&1 || die "installed maven but there is still no $MVN"
}

fetch() {
  jars_cached && return 0
  install
  [[ -n "${BATON_DRY_RUN:-}" ]] && return 0
  local tmp="$KAFKA_LIBS.partial" t0=$SECONDS
  rm -rf "$tmp"; mkdir -p "$tmp"
  log "fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION (+ log4j $LOG4J_VERSION) from Maven Central"
  "$MVN" -B -q -f "$HERE/kafka/pom.xml" \
    -Dkafka.version="$KAFKA_VERSION" -Dlog4j.version="$LOG4J_VERSION" -Dkafka.libs.dir="$tmp" \
    dependency:copy-dependencies >&2 || die "mvn could not fetch the broker's jars (see above)"
  # The classic pitfalls, checked rather than discovered from a silent broker.
  [[ -f "$tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] || die "kafka_2.13-$KAFKA_VERSION.jar missing"
  compgen -G "$tmp/log4j-slf4j-impl-*.jar" >/dev/null || die "SLF4J->log4j2 binding missing"
  compgen -G "$tmp/slf4j-api-1.7.*.jar" >/dev/null ||
    die "slf4j-api is not 1.7.x: this Kafka moved to SLF4J 2; the pom needs log4j-slf4j2-impl"
  [[ $(compgen -G "$tmp/log4j-core-*.jar" | wc -l) -eq 1 ]] || die "more than one log4j-core version"
  touch "$tmp/.complete"
  rm -rf "$KAFKA_LIBS"; mv "$tmp" "$KAFKA_LIBS"
  log "fetched $(compgen -G "$KAFKA_LIBS/*.jar" | wc -l) jars, $(du -sh "$KAFKA_LIBS" | cut -f1), in $((SECONDS - t0))s -> $KAFKA_LIBS"
}

write_config() {
  mkdir -p "$CONF" "$DATA" "$LOGS" "$KAFKA_DIR/tmp"
  local listeners="PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT,CONTROLLER://$KAFKA_HOST:$KAFKA_CONTROLLER_PORT"
  local protocols="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
  if [[ -n "$BATON_SECURE" ]]; then
    listeners="$listeners,SASL_SSL://$KAFKA_HOST:$KAFKA_SECURE_PORT"
    protocols="$protocols,SASL_SSL:SASL_SSL"
  fi
  (umask 077; : >"$CONF/server.properties")
  cat >"$CONF/server.properties" <<EOF
# Written by deploy/local/kafka.sh. KRaft combined mode (broker and controller in one JVM).
process.roles=broker,controller
node.id=$KAFKA_NODE_ID
$(if [[ -n "$KAFKA_VOTERS" ]]; then
  echo "# Cluster mode: a static quorum of every node's controller."
  echo "controller.quorum.voters=$KAFKA_VOTERS"
else
  echo "# Dynamic quorum (KIP-853), the 4.x default: formatted with --standalone."
  echo "controller.quorum.bootstrap.servers=$KAFKA_HOST:$KAFKA_CONTROLLER_PORT"
fi)
listeners=$listeners
advertised.listeners=$listeners
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$DATA
# Internal topics on every node up to 3 (one node: replication factor 1), min ISR 1.
offsets.topic.replication.factor=$KAFKA_RF
transaction.state.log.replication.factor=$KAFKA_RF
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=$KAFKA_RF
share.coordinator.state.topic.min.isr=1
default.replication.factor=$KAFKA_RF
min.insync.replicas=1
# Test-friendly: tests create their own topics; rebalances start at once.
num.partitions=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
offsets.topic.num.partitions=1
transaction.state.log.num.partitions=1
# Tests use short session timeouts to make zombies quickly.
group.min.session.timeout.ms=1000
group.coordinator.rebalance.protocols=classic,consumer
# KIP-848 (consumer protocol) groups: the session is the broker's, not the client's. The chaos
# harness's 3 s (its freezes outlast it) and a 500 ms heartbeat.
group.consumer.min.session.timeout.ms=1000
group.consumer.session.timeout.ms=3000
group.consumer.min.heartbeat.interval.ms=100
group.consumer.heartbeat.interval.ms=500
# A small footprint on a 2-core machine.
log.cleaner.dedupe.buffer.size=33554432
num.network.threads=2
num.io.threads=4
EOF
  if [[ -n "$BATON_SECURE" ]]; then
    local pass; pass="$(cat "$TLS_DIR/store.pass")"
    cat >>"$CONF/server.properties" <<EOF
# BATON_SECURE=1: SASL_SSL (SCRAM-SHA-512 over mutual TLS) and the ACL authorizer.
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$TLS_DIR/server.p12
listener.name.sasl_ssl.ssl.keystore.password=$pass
listener.name.sasl_ssl.ssl.key.password=$pass
listener.name.sasl_ssl.ssl.truststore.type=PKCS12
listener.name.sasl_ssl.ssl.truststore.location=$TLS_DIR/truststore.p12
listener.name.sasl_ssl.ssl.truststore.password=$pass
listener.name.sasl_ssl.ssl.client.auth=required
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS;User:baton-admin
EOF
  fi
  cat >"$CONF/log4j2.properties" <<EOF
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $KAFKA_LOG_LEVEL
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
  cat >"$CONF/tools-log4j2.properties" <<'EOF'
status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF
}

storage_tool() {
  "$JAVA" -Xmx256m -Djava.io.tmpdir="$KAFKA_DIR/tmp" \
    -Dlog4j2.configurationFile="$CONF/tools-log4j2.properties" \
    -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool "$@"
}

# True once the broker answers an ApiVersions v0 request (correlation id 1). In 4.x the client
# listener opens only after the broker is unfenced, so an answer means ready.
api_versions_ok() {
  # shellcheck disable=SC2016
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff" >&3
    r=$(head -c 8 <&3 | od -An -tx1 | tr -d " \n")
    [ "${r:8:8}" = "00000001" ]' "$KAFKA_HOST" "$KAFKA_PORT" 2>/dev/null
}

# Prints the recorded pid if that process is alive and is the broker started with our config.
running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $CONF/server.properties" || return 1
  echo "$pid"
}

start() {
  local pid
  if pid="$(running_pid)"; then log "already running (pid $pid) on $KAFKA_HOST:$KAFKA_PORT"; return 0; fi
  rm -f "$PIDFILE"
  install
  [[ -n "${BATON_DRY_RUN:-}" ]] && { log "dry run: would fetch, format and start with $(find_java || echo 'the Java just installed')"; return 0; }
  JAVA="$(find_java)"
  fetch
  if api_versions_ok; then die "something this script did not start already answers on $KAFKA_HOST:$KAFKA_PORT; set KAFKA_PORT"; fi
  if [[ -n "$BATON_SECURE" ]]; then tls_make "$TLS_DIR" || die "could not make the test CA in $TLS_DIR"; fi
  write_config
  if [[ -f "$DATA/meta.properties" && -f "$KAFKA_DIR/version" && "$(cat "$KAFKA_DIR/version")" != "$KAFKA_VERSION" ]]; then
    die "$DATA was formatted by Kafka $(cat "$KAFKA_DIR/version"), not $KAFKA_VERSION: 'kafka.sh reset' first, or use another BATON_STATE_DIR"
  fi
  if [[ ! -f "$DATA/meta.properties" ]]; then
    echo "$KAFKA_VERSION" >"$KAFKA_DIR/version"
    local cid="${KAFKA_CLUSTER_ID:-}" scram=()
    [[ -n "$cid" ]] || cid="$(storage_tool random-uuid | tail -n1)"
    if [[ -n "$BATON_SECURE" ]]; then
      # Kafka's own tooling creates the SCRAM credentials (KIP-900: format --add-scram).
      scram=(--add-scram "SCRAM-SHA-512=[name=baton-admin,password=$(secret kafka-admin)]"
        --add-scram "SCRAM-SHA-512=[name=baton-runtime,password=$(secret kafka-runtime)]")
    fi
    log "formatting $DATA (cluster id $cid)"
    local quorum=(--standalone)
    [[ -z "$KAFKA_VOTERS" ]] || quorum=() # a static quorum is named in the config
    storage_tool format "${quorum[@]}" -t "$cid" -c "$CONF/server.properties" "${scram[@]}" >"$LOGS/format.out"
    if [[ -n "$BATON_SECURE" ]]; then touch "$KAFKA_DIR/secure.formatted"; fi
  elif [[ -n "$BATON_SECURE" && ! -f "$KAFKA_DIR/secure.formatted" ]]; then
    die "$DATA was formatted without BATON_SECURE=1, so it has no SCRAM users: 'kafka.sh reset' first"
  fi
  log "starting Kafka $KAFKA_VERSION on $KAFKA_HOST:$KAFKA_PORT${BATON_SECURE:+ (SASL_SSL on $KAFKA_SECURE_PORT)}"
  local t0=$SECONDS
  # shellcheck disable=SC2086  # word splitting of KAFKA_HEAP_OPTS / KAFKA_OPTS is intended
  nohup "$JAVA" $KAFKA_HEAP_OPTS \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
    -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Djava.io.tmpdir="$KAFKA_DIR/tmp" \
    -Dkafka.logs.dir="$LOGS" -Dlog4j2.configurationFile="$CONF/log4j2.properties" \
    ${KAFKA_OPTS:-} \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$CONF/server.properties" \
    >>"$LOGS/kafka.out" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PIDFILE"
  [[ -z "${KAFKA_NO_WAIT:-}" ]] || { log "launched (pid $pid), not waiting"; return 0; }
  wait_ready "$pid" "$t0"
}

# wait_ready PID T0 waits until the broker answers (a cluster's nodes answer only once a quorum
# of controllers is up, so cluster mode launches every node before it waits for any).
wait_ready() {
  local pid="$1" t0="$2"
  until api_versions_ok; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 60 "$LOGS/kafka.out" >&2; rm -f "$PIDFILE"; die "kafka exited during start-up (log: $LOGS/kafka.out)"
    fi
    if (( SECONDS - t0 >= KAFKA_START_TIMEOUT )); then
      tail -n 60 "$LOGS/kafka.out" >&2; stop || true; die "not ready after ${KAFKA_START_TIMEOUT}s"
    fi
    sleep 0.3
  done
  log "ready after $((SECONDS - t0))s (pid $pid; log $LOGS/kafka.out)"
}

stop() {
  local pid sig="${1:-TERM}"
  if ! pid="$(running_pid)"; then log "not running"; rm -f "$PIDFILE"; return 0; fi
  log "stopping pid $pid (SIG$sig)"
  kill -"$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then log "still alive after 30s, SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$PIDFILE"
}

print_env() {
  echo "export BATON_KAFKA_BROKERS='$KAFKA_HOST:$KAFKA_PORT'"
  [[ -n "$BATON_SECURE" ]] || return 0
  # The SASL_SSL listener, as internal/testkit/testenv reads it: file paths, never a secret.
  echo "export BATON_SECURE_KAFKA_BROKERS='localhost:$KAFKA_SECURE_PORT'"
  echo "export BATON_SECURE_KAFKA_CA='$TLS_DIR/ca.crt'"
  echo "export BATON_SECURE_KAFKA_CERT='$TLS_DIR/client.crt'"
  echo "export BATON_SECURE_KAFKA_KEY='$TLS_DIR/client.key'"
  echo "export BATON_SECURE_KAFKA_USER='baton-runtime'"
  echo "export BATON_SECURE_KAFKA_PASSWORD_FILE='$SECRETS/kafka-runtime.pass'"
  echo "export BATON_SECURE_KAFKA_ADMIN_USER='baton-admin'"
  echo "export BATON_SECURE_KAFKA_ADMIN_PASSWORD_FILE='$SECRETS/kafka-admin.pass'"
}

# Cluster mode: every command runs this script once per node, with the node's settings.
cluster_dir() { echo "$BATON_STATE_DIR/kafka-cluster"; }
node_port() { echo $((KAFKA_CLUSTER_PORT + 2 * ($1 - 1))); }
# cluster_id prints the cluster's id, made on first use: 16 random bytes in unpadded URL-safe
# base64, as 'kafka-storage random-uuid' prints, and like its ids never beginning with '-'
# (kafka-storage format would take such an id for an option and refuse to format).
cluster_id() {
  local id
  mkdir -p "$(cluster_dir)"
  if [[ ! -s "$(cluster_dir)/cluster.id" ]]; then
    id=-
    while [[ $id == -* ]]; do
      id="$(openssl rand 16 | base64 | tr '+/' '-_' | tr -d '=\n')"
    done
    printf '%s' "$id" >"$(cluster_dir)/cluster.id"
  fi
  cat "$(cluster_dir)/cluster.id"
}
# node CMD I runs this script's CMD for node I of the cluster.
node() {
  local cmd="$1" i="$2" voters="" j
  [[ "$i" =~ ^[0-9]+$ && "$i" -ge 1 && "$i" -le "$KAFKA_NODES" ]] || die "no node '$i' (1..$KAFKA_NODES)"
  for j in $(seq 1 "$KAFKA_NODES"); do voters="$voters${voters:+,}$j@$KAFKA_HOST:$(($(node_port "$j") + 1))"; done
  cluster_id >/dev/null
  local rf=$((KAFKA_NODES < 3 ? KAFKA_NODES : 3))
  KAFKA_NODES=1 KAFKA_NODE_ID="$i" KAFKA_VOTERS="$voters" KAFKA_RF="$rf" \
    KAFKA_DIR="$(cluster_dir)/node-$i" KAFKA_PORT="$(node_port "$i")" KAFKA_CONTROLLER_PORT=$(($(node_port "$i") + 1)) \
    KAFKA_CLUSTER_ID="$(cat "$(cluster_dir)/cluster.id")" KAFKA_HEAP_OPTS="${KAFKA_NODE_HEAP_OPTS:--Xms128m -Xmx384m}" \
    KAFKA_START_TIMEOUT="${KAFKA_NODE_START_TIMEOUT:-300}" \
    "$HERE/kafka.sh" "$cmd"
}
cluster() {
  local cmd="$1" i
  [[ -z "$BATON_SECURE" ]] || die "BATON_SECURE=1 is single-node only"
  case "$cmd" in
    start)
      # One cluster id for every node, made before the nodes start in parallel (each would
      # otherwise race to make its own, and a node formatted with another id never joins).
      cluster_id >/dev/null
      # Every node first (a node answers only once a quorum of controllers runs), then wait.
      for i in $(seq 1 "$KAFKA_NODES"); do KAFKA_NO_WAIT=1 node start "$i" & done
      wait
      for i in $(seq 1 "$KAFKA_NODES"); do node await "$i"; done ;;
    stop|kill|reset) for i in $(seq 1 "$KAFKA_NODES"); do node "$cmd" "$i"; done
      [[ "$cmd" != reset ]] || rm -rf "$(cluster_dir)" ;;
    restart) cluster stop; cluster start ;;
    status) local rc=0; for i in $(seq 1 "$KAFKA_NODES"); do node status "$i" || rc=1; done; return $rc ;;
    env) local b=""; for i in $(seq 1 "$KAFKA_NODES"); do b="$b${b:+,}$KAFKA_HOST:$(node_port "$i")"; done
      echo "export BATON_KAFKA_BROKERS='$b'" ;;
    *) die "cluster mode: unknown command $cmd" ;;
  esac
}

if [[ "$KAFKA_NODES" =~ ^[0-9]+$ && "$KAFKA_NODES" -gt 1 ]]; then
  case "${1:-start}" in
    node-start|node-stop|node-kill|node-restart) c="${1#node-}"; [[ "$c" != kill ]] || c=kill; node "$c" "${2:-}" ;;
    logfile) if [[ -n "${2:-}" ]]; then node logfile "$2"; else for i in $(seq 1 "$KAFKA_NODES"); do node logfile "$i"; done; fi ;;
    install|fetch) "$1" ;; # the same jars for every node: the single-node step, once
    tool) shift; KAFKA_PORT="$(node_port 1)" tool "$@" ;;
    *) cluster "${1:-start}" ;;
  esac
  exit $?
fi

case "${1:-start}" in
  install) install ;;
  fetch) fetch ;;
  start) start ;;
  stop) stop TERM ;;
  kill) stop KILL ;;
  restart) stop TERM; start ;;
  reset) stop TERM; rm -rf "$DATA" "$LOGS" "$KAFKA_DIR/secure.formatted" "$KAFKA_DIR/version" ;;
  status) if api_versions_ok; then log "up on $KAFKA_HOST:$KAFKA_PORT"; else log "down"; exit 1; fi ;;
  env) print_env ;;
  version) echo "$KAFKA_VERSION (log4j $LOG4J_VERSION, jars $KAFKA_LIBS)" ;;
  logfile) echo "$LOGS/kafka.out" ;;
  tool) shift; tool "$@" ;;
  await) pid="$(running_pid)" || die "not running"; wait_ready "$pid" "$SECONDS" ;;
  *) echo "usage: $0 {install|fetch|start|stop|kill|restart|reset|status|env|version|logfile|tool NAME [ARGS]}; KAFKA_NODES=N $0 {...|node-start|node-stop|node-kill|node-restart N}" >&2; exit 2 ;;
esac
