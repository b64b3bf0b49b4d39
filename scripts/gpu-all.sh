#!/usr/bin/env bash
# Runs both GPU bundles, dist/gpu-check/run.sh then dist/gpu-race/run.sh,
# each within its budget (GPU_CHECK_BUDGET, default 240 s; GPU_RACE_BUDGET,
# default 170 s: under 7 minutes for both, whatever happens), and writes
# their logs under LOGDIR (default ./gpu-logs-DATE): gpu-all.log,
# gpu-check/ and gpu-race/ (each its log, summary and tables). Installed
# as dist/gpu-all.sh by `make gpu-check`, `make gpu-race` and `make
# gpu-all`; on the GPU host, from the directory that holds dist/:
#
#   dist/gpu-all.sh LOGDIR
#
# Where dist/gpu-check and dist/gpu-race are absent, it runs them from
# dist/gpu-bundles.tar.gz (`make gpu-all`), unpacked in a temporary
# directory: dist/gpu-all.sh and the archive are all a GPU host needs.
#
# Its exit status is the worse of the bundles': 1 (a step failed or was
# not run for want of time) before 2 (a path the GPU runtime refused)
# before 3 (no usable GPU runtime) before 0 (every step passed).
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$here/gpu-check/run.sh" ] && [ ! -x "$here/gpu-race/run.sh" ] && [ -f "$here/gpu-bundles.tar.gz" ]; then
	unpacked=$(mktemp -d)
	trap 'rm -rf "$unpacked"' EXIT
	if ! tar -C "$unpacked" -xzf "$here/gpu-bundles.tar.gz"; then
		echo "== gpu-all: cannot unpack $here/gpu-bundles.tar.gz"
		exit 1
	fi
	echo "== gpu-all: the bundles of $here/gpu-bundles.tar.gz, unpacked in $unpacked"
	here=$unpacked
fi
logdir=${1:-$PWD/gpu-logs-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$logdir"
logdir=$(cd "$logdir" && pwd)
all="$logdir/gpu-all.log"
: >"$all"
export GPU_CHECK_BUDGET=${GPU_CHECK_BUDGET:-240} GPU_RACE_BUDGET=${GPU_RACE_BUDGET:-170}

results=()
codes=()
for b in gpu-check gpu-race; do
	budget=$GPU_CHECK_BUDGET
	[ "$b" = gpu-race ] && budget=$GPU_RACE_BUDGET
	if [ ! -x "$here/$b/run.sh" ]; then
		echo "== $b: FAIL (no $here/$b/run.sh: make gpu-all builds it)" | tee -a "$all"
		results+=("$b: FAIL (missing)")
		codes+=(1)
		continue
	fi
	start=$SECONDS
	# The bundle keeps to its budget; this bounds it should it not.
	OUT="$logdir/$b" timeout --kill-after=5 $((budget + 20)) "$here/$b/run.sh" 2>&1 | tee -a "$all"
	rc=${PIPESTATUS[0]}
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		echo "== $b: stopped after $((budget + 20))s" | tee -a "$all"
		rc=1
	fi
	results+=("$b: exit status $rc ($((SECONDS - start))s)")
	codes+=("$rc")
done

worst=0
for c in "${codes[@]}"; do
	case "$c" in
	0) ;;
	1) worst=1 ;;
	2) [ "$worst" -ne 1 ] && worst=2 ;;
	3) [ "$worst" -eq 0 ] && worst=3 ;;
	*) worst=1 ;;
	esac
done
{
	echo ""
	echo "== gpu-all: ${SECONDS}s, logs in $logdir"
	for r in "${results[@]}"; do echo "   $r"; done
	for b in gpu-check gpu-race; do
		[ -f "$logdir/$b/$b-summary.txt" ] && sed -n 's/^   \(FAIL\|NOT RUN\)/   '"$b"': \1/p' "$logdir/$b/$b-summary.txt"
	done
	echo "== gpu-all: exit status $worst"
} | tee -a "$all"
exit "$worst"
