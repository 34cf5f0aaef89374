#!/usr/bin/env bash
# promtool.sh - Prometheus's promtool from Debian's prometheus package, used only by
# internal/deploytest to check deploy/prometheus's rules files as Prometheus loads them
# ('promtool check rules'). The package's own server is never started (lib.sh's apt_install
# keeps a package's service from starting). Baton itself never needs it.
#
#   promtool.sh install | status
set -euo pipefail

log() { printf '[promtool.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=deploy/local/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install() {
  command -v promtool >/dev/null 2>&1 && return 0
  apt_install "install Prometheus's promtool yourself (on PATH)" prometheus
  [[ -n "${BATON_DRY_RUN:-}" ]] && return 0
  command -v promtool >/dev/null 2>&1 || die "promtool still not found after install"
}

case "${1:-install}" in
  install) install ;;
  status) if c="$(command -v promtool)"; then log "found $c"; else log "not installed"; exit 1; fi ;;
  *) echo "usage: $0 {install|status}" >&2; exit 2 ;;
esac
