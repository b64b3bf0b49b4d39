#!/usr/bin/env bash
# GPU check of umbp-go, for a host with a GPU (HIP, or the CUDA runtime)
# and neither Go nor network. `make gpu-check` builds this directory
# (dist/gpu-check/) with the binaries it runs; copy it to the GPU host and
# run ./run.sh there (or dist/gpu-all.sh, which runs it and dist/gpu-race).
# It stops within its budget, GPU_CHECK_BUDGET seconds (default 240),
# whatever happens; on the fake runtime of the tests (UMBP_HIP_LIBRARY
# naming internal/hip/testdata/fakegpu.c built with -DFAKE_HIP6
# -DFAKE_SHARED) it takes under a minute on two busy cores.
#
# Every path a GPU block can take, each a step of its own, byte-exact, the
# worker (umbp.test) and the server (umbp-standalone-server -gpu on) as
# separate processes: a job its Wait runs (lock-step, and paused at its
# bound with the server stopped, finished on a goroutine of its own), jobs
# on the transfer goroutines, ranged blocks (many ranges a block, interior
# buffers of one allocation, several allocations), several handles on one
# allocation, AfterStream, a server restart with the same handles, and a
# client process killed with its GPU memory registered. Before them
# internal/hip and the server's HIP backend on the GPU; after them a table:
# Store and Load from GPU memory of 64 x 4 MiB and 64 x 128 layers x
# 32 KiB, beside plain pinned and pageable copies of the same bytes.
#
# Output: stdout, and under $OUT when set: gpu-check.log (everything),
# gpu-check-summary.txt, gpu-bandwidth.txt. Exit status: see steps.sh
# (0 passed, 1 failed, 2 a path the GPU runtime refused, 3 no GPU).
set -u
cd "$(dirname "$0")"
bundle=gpu-check
budget=${GPU_CHECK_BUDGET:-240}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. ./steps.sh
gpu_setup

# umbp_step NAME TEST SECONDS: one TestGPU test of the worker, as a step of its own.
umbp_step() {
	local name=$1 test=$2 secs=$3
	step "$name" "$secs" ./umbp.test -test.v -test.count=1 -test.timeout=$((secs - 5))s -test.run "^$test\$"
}

step "internal/hip on the GPU (copies, streams, events, IPC between two processes)" 45 \
	./hip.test -test.v -test.count=1 -test.timeout=40s -test.run 'GPU'
step "internal/hip: plain copies, 4 MiB and in pieces, pinned and pageable" 40 \
	./hip.test -test.v -test.count=1 -test.run '^$' -test.bench 'Memcpy4MiB|MemcpyPieces|MemcpyLayerMajor' -test.benchtime 50x
step "server: HIP backend on the GPU, GPU regions" 40 \
	./server.test -test.v -test.count=1 -test.timeout=35s -test.run 'GPU|HIP'
umbp_step "job its Wait runs, lock-step on the Wait's goroutine" TestGPUWaitRunsTheJob 25
umbp_step "job paused at its Wait's bound (server stopped), finished on its own goroutine" TestGPUWaitPaused 30
umbp_step "jobs on the transfer goroutines" TestGPUTransferGoroutines 25
umbp_step "ranged: many ranges a block, interior buffers of one allocation" TestGPUInteriorBuffersManyRanges 25
umbp_step "ranged: several allocations" TestGPUSeveralAllocations 25
umbp_step "several handles registering one allocation" TestGPUReregistration 25
umbp_step "AfterStream: stores and loads after the engine's stream" TestGPUAfterStream 25
umbp_step "server restart: the same handles register again, nothing freed while mapped" TestGPUServerRestart 40
umbp_step "crashed client: the server reclaims its GPU mapping" TestGPUCrashedClient 40
umbp_step "bandwidth: Store and Load from GPU memory against plain copies" TestGPUBandwidth 90

if [ -s "$OUT/gpu-bandwidth.txt" ]; then
	say ""
	say "== bandwidth table"
	sed 's/^/   /' "$OUT/gpu-bandwidth.txt" | tee -a "$log"
fi
finish
