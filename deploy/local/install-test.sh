#!/usr/bin/env bash
# install-test.sh - tests the scripts' "install what is missing" logic without installing,
# uninstalling or starting anything: each case runs a script with BATON_DRY_RUN=1 and a PATH
# from which some commands (java, mvn, apt-get, ...) are hidden, and checks what it says it
# would install, or the error it gives. Takes a few seconds; 'make lint' runs it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/baton-install-test.XXXXXX")"
chmod 755 "$TMP"
trap 'rm -rf "$TMP"' EXIT
fails=0
# The cases are single-node ones: a cluster exported in the caller's shell is not theirs.
unset KAFKA_NODES

# pathwithout NAME... prints a directory of links to everything on the system's PATH except NAMEs.
pathwithout() {
  local dir="$TMP/bin-$RANDOM$RANDOM" d f
  mkdir -p "$dir"
  # Reverse PATH order with -f, so that the first directory's command wins as on a real PATH.
  for d in /bin /sbin /usr/bin /usr/sbin /usr/local/bin /usr/local/sbin; do
    [[ -d "$d" && ! -L "$d" ]] || continue
    ln -sf "$d"/* "$dir"/
  done
  for f in "$@"; do rm -f "$dir/$f"; done
  echo "$dir"
}

# [not=TEXT] check NAME WANT_RC WANT CMD... runs CMD and checks its exit status, that its output
# (stdout+stderr) contains WANT ('' = must print nothing) and, if set, does not contain TEXT.
check() {
  local name="$1" want_rc="$2" want="$3" out rc=0; shift 3
  out="$("$@" 2>&1)" || rc=$?
  if [[ $rc -ne $want_rc ]] || { [[ -z "$want" ]] && [[ -n "$out" ]]; } || [[ "$out" != *"$want"* ]] ||
    { [[ -n "${not:-}" ]] && [[ "$out" == *"$not"* ]]; }; then
    printf 'FAIL %s: exit %d (want %d), output:\n%s\n(want it to contain: %s%s)\n' "$name" "$rc" "$want_rc" \
      "$out" "${want:-nothing}" "${not:+; and not: $not}"
    fails=$((fails + 1))
  else
    printf 'ok   %s\n' "$name"
  fi
}

empty="$TMP/empty"; mkdir -p "$empty"
cached="$TMP/cached"; mkdir -p "$cached"; touch "$cached/.complete"
nojava="$(pathwithout java mvn sudo redis-server)"
noapt="$(pathwithout java mvn apt-get)"
# kafka [VAR=VALUE...] ARG runs kafka.sh in dry-run mode with no Java found and no jars cached,
# unless the VARs say otherwise. One Java package, so that apt-cache (slow) is not asked.
kafka() {
  env -u JAVA -u JAVA_HOME BATON_DRY_RUN=1 PATH="$nojava" JVM_DIR="$empty" KAFKA_LIBS="$empty/libs" \
    JAVA_PACKAGES=openjdk-17-jre-headless "$@"
}
ks="$HERE/kafka.sh"

check "kafka: nothing missing, nothing said" 0 "" \
  env BATON_DRY_RUN=1 KAFKA_LIBS="$cached" bash "$ks" install
check "kafka: no java, no mvn, jars not cached: one apt-get for both" 0 \
  "would run: apt-get update; apt-get install -y --no-install-recommends openjdk-17-jre-headless maven" \
  kafka bash "$ks" install
not=maven check "kafka: no java, jars cached: Maven is not needed" 0 \
  "apt-get install -y --no-install-recommends openjdk-17-jre-headless" \
  kafka KAFKA_LIBS="$cached" bash "$ks" install
check "kafka: start when java is missing installs first and starts nothing" 0 "dry run: would fetch, format and start" \
  kafka BATON_STATE_DIR="$TMP/state" bash "$ks" start
if [[ -n "$(compgen -G '/usr/lib/jvm/java-*-openjdk-*/bin/java')" ]]; then
  check "kafka: java not on PATH, but a Debian OpenJDK under /usr/lib/jvm is found" 0 "" \
    kafka JVM_DIR=/usr/lib/jvm KAFKA_LIBS="$cached" bash "$ks" install
fi
check "kafka: JAVA pinned to something that does not run: an error, no install" 1 "JAVA=/nonexistent/java does not run" \
  kafka JAVA=/nonexistent/java bash "$ks" install
check "kafka: no apt-get: says what to install by hand" 1 "no apt-get to install" \
  kafka PATH="$noapt" bash "$ks" install
if [[ "$(id -u)" -eq 0 ]] && command -v runuser >/dev/null 2>&1; then
  check "kafka: not root and no sudo: says so" 1 "needs root and there is no sudo" \
    runuser -u nobody -- env -u JAVA -u JAVA_HOME BATON_DRY_RUN=1 PATH="$nojava" HOME="$TMP" \
    JVM_DIR="$empty" KAFKA_LIBS="$empty/libs" JAVA_PACKAGES=openjdk-17-jre-headless bash "$ks" install
fi
if [[ "$(apt-cache policy openjdk-17-jre-headless 2>/dev/null)" == *"Candidate: "[0-9]* ]]; then
  check "kafka: the first Java package apt has a candidate for is chosen" 0 \
    "--no-install-recommends openjdk-17-jre-headless maven" \
    kafka JAVA_PACKAGES="baton-no-such-jre|openjdk-17-jre-headless|default-jre-headless" bash "$ks" install
fi
check "kafka: a command-line tool fetches kafka-tools once, into a cache of its own" 0 \
  "would fetch org.apache.kafka:kafka-tools:" \
  env BATON_DRY_RUN=1 KAFKA_TOOLS_LIBS="$empty/tools" bash "$ks" tool kafka-consumer-groups.sh --list
check "kafka: a cached tool runs its class" 0 "would run org.apache.kafka.tools.consumer.group.ConsumerGroupCommand" \
  env BATON_DRY_RUN=1 KAFKA_TOOLS_LIBS="$cached" bash "$ks" tool kafka-consumer-groups.sh --list
check "kafka: an unknown tool is named" 1 "unknown tool 'kafka-nope.sh'" \
  env BATON_DRY_RUN=1 KAFKA_TOOLS_LIBS="$cached" bash "$ks" tool kafka-nope.sh
check "postgres: no server binaries" 0 "apt-get install -y --no-install-recommends postgresql postgresql-contrib" \
  env BATON_DRY_RUN=1 PG_BIN="$empty" bash "$HERE/postgres.sh" install
check "redis: no redis-server" 0 "apt-get install -y --no-install-recommends redis-server" \
  env PATH="$nojava" BATON_DRY_RUN=1 bash "$HERE/redis.sh" install
nochromium="$(pathwithout sudo chromium chromium-browser)"
check "chromium: none installed" 0 "apt-get install -y --no-install-recommends chromium" \
  env PATH="$nochromium" BATON_CHROMIUM= BATON_DRY_RUN=1 bash "$HERE/chromium.sh" install
nopromtool="$(pathwithout sudo promtool)"
check "promtool: none installed: Debian's prometheus package" 0 "apt-get install -y --no-install-recommends prometheus" \
  env PATH="$nopromtool" BATON_DRY_RUN=1 bash "$HERE/promtool.sh" install

[[ $fails -eq 0 ]] || { echo "install-test.sh: $fails failed"; exit 1; }
