# Sourced by the run.sh of dist/gpu-check and of dist/gpu-race
# (scripts/gpu-check.sh, scripts/gpu-race.sh), installed beside it as
# steps.sh: the host's GPU runtime found, and the steps run, named, each
# under its own time limit and all within the bundle's budget, each
# reported PASS, FAIL, NO GPU or NOT RUN, then a summary and the exit
# status:
#
#   0  every step passed
#   1  a step failed, or was not run for want of time
#   2  nothing failed, but a path could not run for a reason of the GPU
#      runtime or its driver, named in the step's output and the summary
#   3  this host has no usable GPU runtime: nothing that needs one ran
#
# The caller sets bundle (its name), budget (its seconds in all) and
# work (a scratch directory), and OUT where the log is to go.

log="$work/$bundle.log"
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT"
	log="$OUT/$bundle.log"
else
	export OUT="$work" # where a test leaves its tables
fi
: >"$log"
say() { printf '%s\n' "$*" | tee -a "$log"; }

# gpu_setup says what this host is, and points the runtime's loader at a
# CUDA runtime that ldconfig does not know of.
gpu_setup() {
	say "== umbp-go $bundle, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(uname -m), kernel $(uname -r)), build $(cat BUILD 2>/dev/null || echo unknown)"
	if command -v nvidia-smi >/dev/null 2>&1; then
		nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/   gpu: /' | tee -a "$log"
	fi
	if command -v rocm-smi >/dev/null 2>&1; then
		rocm-smi --showproductname 2>&1 | sed 's/^/   gpu: /' | tee -a "$log"
	fi
	# The CUDA runtime loads the driver (libcuda.so.1) by soname.
	if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [ -e /usr/local/nvidia/lib64/libcuda.so.1 ]; then
		export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	fi
	# The CUDA runtime is found by soname, under $CUDA_HOME and
	# /usr/local/cuda, or in Python wheels under $VIRTUAL_ENV. Elsewhere (a
	# virtual environment that is not activated, say), point
	# UMBP_CUDART_LIBRARY at it.
	if [ -z "${UMBP_CUDART_LIBRARY:-}" ] && [ -z "${UMBP_HIP_LIBRARY:-}" ] &&
		! ldconfig -p 2>/dev/null | grep -Eq 'libamdhip64\.so|libcudart\.so\.1[23]' &&
		[ ! -e /usr/local/cuda/lib64/libcudart.so.13 ] && [ ! -e /usr/local/cuda/lib64/libcudart.so.12 ]; then
		for f in /usr/local/cuda*/lib64/libcudart.so.1[32] /usr/local/cuda*/targets/*/lib/libcudart.so.1[32] \
			/opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so.13 \
			/opt/*/lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so.13 \
			/usr/lib/python3*/dist-packages/nvidia/cu13/lib/libcudart.so.13 \
			/opt/*/.venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.1[23] \
			/usr/local/lib/python3*/dist-packages/nvidia/cu13/lib/libcudart.so.13; do
			if [ -e "$f" ]; then
				export UMBP_CUDART_LIBRARY="$f"
				break
			fi
		done
	fi
	say "   runtime libraries known to ldconfig: $(ldconfig -p 2>/dev/null | grep -Eo '/[^ ]*(libcudart|libcuda|libamdhip64)\.so[^ ]*' | tr '\n' ' ')"
	say "   UMBP_HIP_LIBRARY=${UMBP_HIP_LIBRARY:-} UMBP_CUDART_LIBRARY=${UMBP_CUDART_LIBRARY:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
	say "   budget: ${budget}s for every step together"
	export UMBP_GPU_SERVER_BIN="$PWD/umbp-standalone-server"
}

names=()
statuses=()

# step NAME SECONDS COMMAND...: runs the command under a limit of SECONDS
# (less if less of the budget is left; not at all under 10 s), the whole
# output to the log, the tests' results to stdout (and, when it does not
# pass, its last lines), and records how it went.
step() {
	local name=$1 secs=$2
	shift 2
	local left=$((budget - SECONDS))
	say ""
	if [ "$left" -lt 10 ]; then
		say "== $name: NOT RUN (the bundle's ${budget}s are spent)"
		names+=("$name")
		statuses+=("NOT RUN (out of time)")
		return
	fi
	if [ "$secs" -gt "$left" ]; then
		secs=$left
	fi
	say "== $name"
	say "   \$ $* (at most ${secs}s)"
	local start=$SECONDS out="$work/step.out"
	: >"$out"
	timeout --kill-after=5 "$secs" "$@" 2>&1 | tee "$out" |
		grep --line-buffered -E -- '^ *--- (PASS|FAIL|SKIP)|GPU PATH NOT RUN: |DATA RACE|^panic: |ns/op' | sed -u 's/^/   /'
	local rc=${PIPESTATUS[0]} took=$((SECONDS - start)) status
	cat "$out" >>"$log"
	if grep -q 'GPU PATH NOT RUN: ' "$out"; then
		status="NOT RUN (GPU runtime)"
	elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		status="FAIL (stopped after ${secs}s)"
	elif grep -q 'DATA RACE' "$out"; then
		status="FAIL (data race)"
	elif [ "$rc" -ne 0 ]; then
		status="FAIL (status $rc)"
	elif grep -q 'no usable GPU runtime on this host' "$out"; then
		status="NO GPU"
	elif grep -Eq -- '--- SKIP: (TestGPU|Benchmark)' "$out"; then
		status="FAIL (a GPU test skipped)"
	elif ! grep -Eq -- '--- PASS: |ns/op' "$out"; then
		status="FAIL (ran no test)"
	else
		status="PASS"
	fi
	if [ "${status%% *}" != PASS ] && [ "$status" != "NO GPU" ]; then
		say "   ... its last lines:"
		tail -n 40 "$out" | sed 's/^/   | /'
	fi
	if [ "$status" = "NO GPU" ]; then
		say "   $(grep -m1 -o 'no usable GPU runtime on this host.*' "$out" | cut -c1-200)"
	fi
	say "== $name: $status (${took}s)"
	names+=("$name")
	statuses+=("$status")
}

# finish prints the summary (also to $OUT/$bundle-summary.txt) and exits
# with the bundle's status.
finish() {
	local i pass=0 fail=0 driver=0 nogpu=0 s
	for s in "${statuses[@]}"; do
		case "$s" in
		PASS) pass=$((pass + 1)) ;;
		"NO GPU") nogpu=$((nogpu + 1)) ;;
		"NOT RUN (GPU runtime)") driver=$((driver + 1)) ;;
		*) fail=$((fail + 1)) ;;
		esac
	done
	local code=0 meaning="every step passed"
	if [ "$fail" -gt 0 ]; then
		code=1 meaning="a step failed"
	elif [ "$driver" -gt 0 ]; then
		code=2 meaning="a path could not run for a reason of the GPU runtime"
	elif [ "$nogpu" -gt 0 ]; then
		code=3 meaning="no usable GPU runtime on this host"
	fi
	{
		echo "== $bundle summary: $pass passed, $fail failed, $driver not run (GPU runtime), $nogpu no GPU; ${SECONDS}s"
		for i in "${!names[@]}"; do
			printf '   %-22s %s\n' "${statuses[$i]}" "${names[$i]}"
		done
		grep -ho 'GPU PATH NOT RUN: .*' "$log" | sort -u | cut -c1-400 | sed 's/^/   /'
		echo "== $bundle: exit status $code ($meaning)"
	} >"$work/summary"
	echo "" | tee -a "$log"
	tee -a "$log" <"$work/summary"
	if [ "$OUT" != "$work" ]; then
		cp "$work/summary" "$OUT/$bundle-summary.txt"
	fi
	exit "$code"
}
