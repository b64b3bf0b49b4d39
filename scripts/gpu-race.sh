#!/usr/bin/env bash
# The GPU tests of internal/server and umbp under the race detector, the
# worker and the server process both built with it. `make gpu-race` builds
# this directory (dist/gpu-race/); copy it to a GPU host with neither Go nor
# network and run ./run.sh there. It takes about a minute, at most four. A
# data race fails the test it happens in, and a GPU test that skips fails
# the check. The whole output goes to $OUT/gpu-race.log when $OUT names a
# directory; stdout gets the test results.
set -u
cd "$(dirname "$0")"
log=/dev/null
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT"
	log="$OUT/gpu-race.log"
fi
# The CUDA runtime loads the driver (libcuda.so.1) by soname.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [ -e /usr/local/nvidia/lib64/libcuda.so.1 ]; then
	export LD_LIBRARY_PATH="/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export UMBP_GPU_SERVER_BIN="$PWD/umbp-standalone-server"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
{
	echo "== umbp-go GPU race check, build $(cat BUILD 2>/dev/null || echo unknown)"
	timeout --kill-after=10 100 ./server.test -test.count=3 -test.timeout=90s -test.v -test.run 'GPU|HIP' || echo "== server.test failed"
	timeout --kill-after=10 200 ./umbp.test -test.count=2 -test.timeout=190s -test.v -test.run '^TestGPU' || echo "== umbp.test failed"
} 2>&1 | tee "$out" >"$log"
grep -E -- '^--- (PASS|FAIL|SKIP)|^== |DATA RACE' "$out"
# A GPU test that skips fails the check: it is for hosts where they run.
if grep -q -e '^== .* failed' -e '^--- SKIP: TestGPU' "$out"; then
	status=1
fi
if [ "$status" -eq 0 ]; then echo "== PASS"; else echo "== FAIL"; fi
exit "$status"
