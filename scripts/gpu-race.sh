#!/usr/bin/env bash
# The GPU tests of internal/server and umbp under the race detector, the
# worker and the server process both built with it: the steps of
# gpu-check.sh but the bandwidth table. `make gpu-race` builds this
# directory (dist/gpu-race/); copy it to a GPU host with neither Go nor
# network and run ./run.sh there (or dist/gpu-all.sh). It stops within its
# budget, GPU_RACE_BUDGET seconds (default 170), whatever happens; on the
# fake runtime it takes about a minute on two busy cores. A data race fails
# the step it happens in, in the worker or in the server.
#
# Output: stdout, and under $OUT when set: gpu-race.log (everything) and
# gpu-race-summary.txt. Exit status: see steps.sh (0 passed, 1 failed,
# 2 a path the GPU runtime refused, 3 no GPU).
set -u
cd "$(dirname "$0")"
bundle=gpu-race
budget=${GPU_RACE_BUDGET:-170}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. ./steps.sh
gpu_setup

umbp_step() {
	local name=$1 test=$2 secs=$3
	step "$name (race)" "$secs" ./umbp.test -test.v -test.count=1 -test.timeout=$((secs - 5))s -test.run "^$test\$"
}

step "server: HIP backend on the GPU, GPU regions (race)" 60 \
	./server.test -test.v -test.count=1 -test.timeout=55s -test.run 'GPU|HIP'
umbp_step "job its Wait runs, lock-step on the Wait's goroutine" TestGPUWaitRunsTheJob 35
umbp_step "job paused at its Wait's bound (server stopped), finished on its own goroutine" TestGPUWaitPaused 40
umbp_step "jobs on the transfer goroutines" TestGPUTransferGoroutines 35
umbp_step "ranged: many ranges a block, interior buffers of one allocation" TestGPUInteriorBuffersManyRanges 35
umbp_step "ranged: several allocations" TestGPUSeveralAllocations 35
umbp_step "several handles registering one allocation" TestGPUReregistration 35
umbp_step "AfterStream: stores and loads after the engine's stream" TestGPUAfterStream 35
umbp_step "server restart: the same handles register again, nothing freed while mapped" TestGPUServerRestart 50
umbp_step "crashed client: the server reclaims its GPU mapping" TestGPUCrashedClient 50
finish
