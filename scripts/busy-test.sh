#!/usr/bin/env bash
# Runs the README's test command N times (default 10) with a CPU hog beside
# it: two busy threads per core (scripts/cpuhog), as a shared CI host has.
# Each run's output is kept; every test that failed is named with the run
# it failed in. Exits 1 if any run failed.
#
#   scripts/busy-test.sh [N]          # from the repository's root
#   KEEP=/tmp/busy scripts/busy-test.sh 3
set -u
n=${1:-10}
keep=${KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/umbp-busy-test.XXXXXX")}
mkdir -p "$keep"
go build -o "$keep/cpuhog" ./scripts/cpuhog || exit 2
"$keep/cpuhog" -per-core 2 &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
echo "busy-test: $n runs of make test beside $(($(nproc) * 2)) busy threads; logs in $keep"
failed=0
for i in $(seq 1 "$n"); do
  log="$keep/run-$i.log"
  start=$(date +%s)
  if make test >"$log" 2>&1; then
    echo "run $i: ok ($(($(date +%s) - start)) s)"
  else
    failed=$((failed + 1))
    echo "run $i: FAIL ($(($(date +%s) - start)) s): $log"
    grep -E '^\s*--- FAIL|^FAIL\s' "$log" | sed 's/^/  /' | sort -u
  fi
done
echo "busy-test: $((n - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
