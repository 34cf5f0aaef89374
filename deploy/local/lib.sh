# lib.sh - sourced by the deploy/local scripts (not run on its own): installing Debian packages.
# The caller defines log and die.

# apt_install HINT PKG... installs the packages with apt-get, non-interactively and without
# recommends, as root or through sudo. A PKG may list alternatives, 'a|b': the first one apt has
# a candidate for is installed (Debian 12 has openjdk-17, Debian 13 only newer ones). A package's
# own service is kept from starting (policy-rc.d exit 101): these scripts run their own instance
# on their own port. HINT says what to do by hand when apt-get or root is missing.
# With BATON_DRY_RUN=1 it prints what it would install and changes nothing.
apt_install() {
  local hint="$1"; shift
  command -v apt-get >/dev/null 2>&1 || die "no apt-get to install $*; $hint"
  local SUDO=""
  if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "installing $* needs root and there is no sudo; run as root, or $hint"
    SUDO="sudo"
  fi
  local t0=$SECONDS
  if [[ -z "${BATON_DRY_RUN:-}" ]]; then
    log "apt-get update (to install $*)"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update failed"
  fi
  local pkgs=() p
  for p in "$@"; do pkgs+=("$(apt_candidate "$p")"); done
  if [[ -n "${BATON_DRY_RUN:-}" ]]; then
    log "dry run: would run: ${SUDO:+$SUDO }apt-get update; ${SUDO:+$SUDO }apt-get install -y --no-install-recommends ${pkgs[*]}"
    return 0
  fi
  log "installing ${pkgs[*]} from Debian's packages"
  local policy=/usr/sbin/policy-rc.d created=""
  if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod +x "$policy" && created=1
  fi
  local rc=0
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >&2 || rc=$?
  [[ -n "$created" ]] && $SUDO rm -f "$policy"
  [[ $rc -eq 0 ]] || die "apt-get install ${pkgs[*]} failed (exit $rc)"
  log "installed ${pkgs[*]} in $((SECONDS - t0))s"
}

# apt_candidate 'a|b|c' prints the first of the alternatives apt has a candidate version for,
# or the first one when apt knows none of them (apt-get then says why).
apt_candidate() {
  local alts p
  IFS='|' read -r -a alts <<<"$1"
  [[ ${#alts[@]} -gt 1 ]] || { echo "$1"; return 0; }
  for p in "${alts[@]}"; do
    # Not '| grep -q': under pipefail, grep's early exit would fail apt-cache with SIGPIPE.
    if [[ "$(apt-cache policy "$p" 2>/dev/null)" == *"Candidate: "[0-9]* ]]; then echo "$p"; return 0; fi
  done
  echo "${alts[0]}"
}
