#!/usr/bin/env bash
# chromium.sh - Debian's headless Chromium, used only by the status page's browser test
# (internal/operator/status, driven from Go with chromedp). Baton itself never needs a browser.
#
#   chromium.sh install | status | env
set -euo pipefail

log() { printf '[chromium.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

find_chromium() {
  local c
  for c in "${BATON_CHROMIUM:-}" chromium chromium-browser; do
    [[ -n "$c" ]] && command -v "$c" 2>/dev/null && return 0
  done
  return 1
}

install() {
  find_chromium >/dev/null && return 0
  apt_install "install Chromium yourself and set BATON_CHROMIUM to its path" chromium
  [[ -n "${BATON_DRY_RUN:-}" ]] && return 0
  find_chromium >/dev/null || die "chromium still not found after install"
}

case "${1:-install}" in
  install) install ;;
  status) if c="$(find_chromium)"; then log "found $c"; else log "not installed"; exit 1; fi ;;
  env) if c="$(find_chromium)"; then echo "export BATON_CHROMIUM='$c'"; fi ;;
  *) echo "usage: $0 {install|status|env}" >&2; exit 2 ;;
esac
