#!/usr/bin/env bash
# GPU check of umbp-go, for a host with a GPU (HIP, or the CUDA runtime)
# and neither Go nor network. `make gpu-check` builds this directory
# (dist/gpu-check/) with the binaries it runs; copy it to the GPU host and
# run ./run.sh there. It takes about two minutes, at most five.
#
#   (a) internal/hip against the real runtime, including a two-process IPC
#       test, and the HIP backend of the server (pinning, copies);
#   (b) the worker (umbp.test) and the server (umbp-standalone-server -gpu on) as
#       two processes: GPU blocks stored and loaded byte-exactly (interior
#       buffers of one allocation, several allocations, many ranges a block,
#       registration from several handles, AfterStream);
#   (c) Store and Load of 64 objects of 4 MiB from GPU memory in GB/s, next
#       to plain pinned and pageable copies of the same bytes.
#
# Output goes to stdout and, when $OUT names a directory, to
# $OUT/gpu-check.log (everything), $OUT/gpu-bandwidth.txt (the table) and
# $OUT/gpu-check-summary.txt. The exit status is 0 only if every step passed.
set -u
cd "$(dirname "$0")"
here=$(pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/gpu-check.log"
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT"
	log="$OUT/gpu-check.log"
fi
: >"$log"
say() { printf '%s\n' "$*" | tee -a "$log"; }

say "== umbp-go GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(uname -m), kernel $(uname -r))"
if command -v nvidia-smi >/dev/null 2>&1; then
	nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/   gpu: /' | tee -a "$log"
fi
if command -v rocm-smi >/dev/null 2>&1; then
	rocm-smi --showproductname 2>&1 | sed 's/^/   gpu: /' | tee -a "$log"
fi

if [ -f BUILD ]; then
	say "   build: $(cat BUILD)"
fi
# The CUDA runtime loads the driver (libcuda.so.1) by soname.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [ -e /usr/local/nvidia/lib64/libcuda.so.1 ]; then
	export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The CUDA runtime is found by soname, under $CUDA_HOME and /usr/local/cuda,
# or in Python wheels under $VIRTUAL_ENV. Elsewhere (a virtual environment
# that is not activated, say), point UMBP_CUDART_LIBRARY at it.
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
say "   runtime libraries under /usr/local: $(ls /usr/local/cuda*/lib64/libcudart.so.* /usr/local/nvidia/lib64/libcuda.so.* 2>/dev/null | tr '\n' ' ')"
say "   UMBP_HIP_LIBRARY=${UMBP_HIP_LIBRARY:-} UMBP_CUDART_LIBRARY=${UMBP_CUDART_LIBRARY:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

passed=()
failed=()
# step NAME SECONDS COMMAND...: runs the command under a time limit, its
# output to stdout and the log. A GPU test that skips fails the step: this
# check is for hosts where they must run.
step() {
	local name=$1 secs=$2
	shift 2
	say ""
	say "== $name"
	say "   \$ $*"
	local start=$SECONDS
	: >"$work/step.out"
	timeout --kill-after=10 "$secs" "$@" 2>&1 | tee -a "$work/step.out" "$log"
	local rc=${PIPESTATUS[0]}
	local took=$((SECONDS - start))
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		say "   (stopped after ${secs}s)"
	fi
	if [ "$rc" -eq 0 ] && grep -Eq -- '--- SKIP: (TestGPU|Benchmark)' "$work/step.out"; then
		say "   GPU tests skipped: see the lines after '--- SKIP'"
		rc=1
	fi
	if [ "$rc" -eq 0 ]; then
		passed+=("$name")
		say "== $name: PASS (${took}s)"
	else
		failed+=("$name")
		say "== $name: FAIL (status $rc, ${took}s)"
	fi
}

export UMBP_GPU_SERVER_BIN="$here/umbp-standalone-server"

# Limits: 295 s in all.
step "(a) internal/hip on the GPU" 60 \
	./hip.test -test.v -test.count=1 -test.timeout=55s -test.run 'GPU'
step "(a) internal/hip: 4 MiB copies, pinned and pageable, whole and in pieces" 40 \
	./hip.test -test.v -test.count=1 -test.run '^$' -test.bench 'Memcpy4MiB|MemcpyPieces|MemcpyLayerMajor' -test.benchtime 50x
step "(a) server: HIP backend and GPU regions" 45 \
	./server.test -test.v -test.count=1 -test.timeout=40s -test.run 'GPU|HIP'
step "(b) worker and server processes: GPU blocks byte-exact" 100 \
	./umbp.test -test.v -test.count=1 -test.timeout=95s \
	-test.run '^TestGPU(InteriorBuffersManyRanges|SeveralAllocations|Reregistration|AfterStream)$'
step "(c) bandwidth: 64 x 4 MiB Store/Load against plain copies" 60 \
	./umbp.test -test.v -test.count=1 -test.timeout=55s -test.run '^TestGPUBandwidth$'

summary() {
	for n in ${passed[@]+"${passed[@]}"}; do echo "PASS $n"; done
	for n in ${failed[@]+"${failed[@]}"}; do echo "FAIL $n"; done
}
say ""
say "== summary: ${#passed[@]} passed, ${#failed[@]} failed"
summary | sed 's/^/   /' | tee -a "$log"
if [ -n "${OUT:-}" ]; then
	summary >"$OUT/gpu-check-summary.txt"
fi
[ "${#failed[@]}" -eq 0 ]
