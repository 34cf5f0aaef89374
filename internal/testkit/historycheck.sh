#!/usr/bin/env bash
# historycheck fails when the code narrates its own history: issue numbers, review findings,
# review or session names, the retired mutant switches. It reads every tracked Go file (code,
# comments, CLI help, package docs; test files too, and their names). History belongs in commit
# messages, the verification record (docs/verification.md) and the decisions (docs/decisions).
#
#	internal/testkit/historycheck.sh          # from anywhere in the checkout; exit 1 on a hit
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

words='\b[Ii]ssues? ?-?[0-9]+\b|\b[Ff]indings? [0-9]+|\b[Ff]inding (from|of)\b|\b[Ff]inding "?[A-Z][a-z]+[A-Z]|[Rr]eview finding|\b[Rr]eview of\b|\(found by review\)|\brev-[a-z0-9]+|Appended by|\b[Ss]ession [0-9]+\b|\b[Rr]ound [0-9]+ of (the )?review|batonmutant|if mutant\b|\bis\(mutant|mutant\.Is\(|\bIssueFaults\b|\bIssue[0-9]+'
names='(^|/)(issue[0-9]+[^/]*|[^/]*_review_test|rev_[^/]*|[^/]*_findings?_test)\.go$'

status=0
hits="$(git ls-files -z -- '*.go' | xargs -0 grep -nHE "$words" -- | grep -vE 'rev-(parse|list)\b' || true)"
if [ -n "$hits" ]; then
	echo "work-history words in Go files (describe what the code does; history goes in commit messages):"
	echo "$hits"
	status=1
fi
files="$(git ls-files -- '*.go' | grep -E "$names" || true)"
if [ -n "$files" ]; then
	echo "test files named after how they were written (name them by the unit they test):"
	echo "$files"
	status=1
fi
exit $status
