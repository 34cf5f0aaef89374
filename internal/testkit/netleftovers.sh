#!/usr/bin/env bash
# netleftovers.sh - list what the chaos runs' network faults created and a run whose process is
# gone left behind: network namespaces, links, iptables chains (and jumps to them) and cgroups
# named bn<pid in base 36>_<run>-..., and exit 1 if there is any. A run's test process removes
# what it created when it ends (and asserts it); this catches a process that could not (killed,
# crashed). The names of a live process's runs (another lane's run in progress) are not
# leftovers.
set -uo pipefail
names() {
  ip netns list 2>/dev/null | awk '{print $1}'
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1
  iptables -w -S 2>/dev/null | awk '$1 == "-N" { print $2 } { for (i = 1; i < NF; i++) if ($i == "-j") print $(i + 1) }'
  for d in $(awk '{for (i = 1; i < NF; i++) if ($i == "-" && $(i+1) == "cgroup2") print $5}' /proc/self/mountinfo); do
    ls -d "$d"/bn* 2>/dev/null
  done
}
left=0
while read -r n; do
  [[ ${n##*/} =~ ^bn([0-9a-z]+)_ ]] || continue
  [[ -d /proc/$((36#${BASH_REMATCH[1]})) ]] && continue
  [[ $left -eq 0 ]] && echo "left behind by chaos runs that are gone:"
  echo "  $n"
  left=1
done < <(names | sort -u)
exit $left
