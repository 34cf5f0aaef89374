#!/usr/bin/env bash
# tls.sh DIR - a throwaway certificate authority and the certificates Baton's secure test mode
# uses, made with openssl (keys, CA, signing) and keytool (the broker's Java trust store). Idempotent:
# an existing, complete DIR is kept (delete it to start again). Sourced by kafka.sh and postgres.sh
# when BATON_SECURE=1; also runnable on its own.
#
#   ca.crt ca.key                 the CA (10 days; nothing outside DIR trusts it)
#   server.crt server.key         the brokers' and PostgreSQL's certificate: CN=localhost,
#                                 SAN DNS:localhost, IP:127.0.0.1 (so verify-full checks the name)
#   server.p12                    server.crt+key for the broker (PKCS12, password in store.pass)
#   truststore.p12                ca.crt for the broker (keytool, PKCS12): client certificates
#   client.crt client.key         the runtime client's certificate (mutual TLS), CN=baton-runtime
#   store.pass                    the PKCS12 stores' password (random, mode 600)
#
# Secrets (keys, passwords) are files of mode 600; nothing secret is printed.
set -euo pipefail

tls_make() {
  local dir="$1"
  [[ -f "$dir/.complete" ]] && return 0
  command -v openssl >/dev/null 2>&1 || { echo "[tls.sh] ERROR: openssl is needed (apt-get install openssl)" >&2; return 1; }
  local keytool="${KEYTOOL:-}"
  if [[ -z "$keytool" ]]; then
    keytool="$(command -v keytool || true)"
    [[ -n "$keytool" ]] || keytool="$(compgen -G '/usr/lib/jvm/java-*-openjdk-*/bin/keytool' | sort -V | tail -n1 || true)"
  fi
  [[ -n "$keytool" && -x "$keytool" ]] || { echo "[tls.sh] ERROR: keytool (comes with Java 17+, kafka.sh install) is needed" >&2; return 1; }
  rm -rf "$dir"; mkdir -p "$dir"; chmod 755 "$dir"
  (
    cd "$dir"
    umask 077
    openssl rand -hex 16 >store.pass
    local pass; pass="$(cat store.pass)"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 10 -subj "/CN=baton-test-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout ca.key -out ca.crt 2>/dev/null
    # leaf NAME CN EXT: a key and a certificate signed by the CA.
    leaf() {
      openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 10 -sha256 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    leaf server localhost "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
    leaf client baton-runtime "extendedKeyUsage=clientAuth"
    openssl pkcs12 -export -in server.crt -inkey server.key -certfile ca.crt -name server \
      -passout "pass:$pass" -out server.p12
    "$keytool" -importcert -noprompt -alias baton-test-ca -file ca.crt -storetype PKCS12 \
      -keystore truststore.p12 -storepass "$pass" >/dev/null 2>&1
    # Readable certificates; keys readable by their owner only. PostgreSQL (running as
    # 'postgres') gets its own copy of the server key (postgres.sh).
    chmod 644 ca.crt server.crt client.crt
    touch .complete
  )
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  [[ $# -eq 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
  tls_make "$1"
fi
