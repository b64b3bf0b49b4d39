# umbp-go. `make test` is what CI runs (.ci/run); `make demo` runs the main example.
GO       ?= go
PROTOC   ?= protoc
# protoc comes from Debian (protobuf-compiler 3.21.12, recorded in the
# generated headers); the Go plugins and staticcheck are pinned as tools in
# tools/go.mod, a module of their own that no published module requires.
TOOL := cd tools && $(GO) tool -n
PROTOC_VERSION := 3.21.12

.PHONY: all build test test-short proto proto-check lint bench demo fuzz clean tool check-tree

all: build lint test

build:
	$(GO) build ./...
	@set -e; for m in $(MODULES); do $(GO) build -C $$m -o /dev/null ./...; done

# The other modules (their own go.mod each; go.work puts them together) are
# tested after the core. scripts/testprogress lists each package as it
# finishes, and what is still building or running every 30 s without one;
# the first run compiles gRPC under the race detector.
# The tool and the server are modules of their own (the tool's progress bar
# and terminal, and the server's Prometheus client library, are none of the
# library's requirements), and so is the tokenizer (contrib/hftokenizer:
# regexp2, gonja and x/text stay out of the library's). tools comes last: its test lays every published
# module out as a module proxy and installs and builds them from it, offline,
# from the module cache the others' tests filled (docs/RELEASING.md).
CONTRIB := cmd/umbp cmd/umbp-standalone-server contrib/prometheus contrib/otel contrib/hftokenizer
MODULES := $(CONTRIB) tools
TESTFLAGS := -race -count=1 -timeout 10m
# The scheduler's tests run a second time with its lookups through grpc-go's
# call path (Config.GRPCLookups) instead of the lock-step call: every
# guarantee holds on both.
SCHEDULER_TESTS := Lookup|Caller|Oversized|Schedul|Cluster|Score|Quarantin|Replica|StoreOutage|Hostile|Errors|Attach|Restart|Token|Example
test:
	@GO='$(GO)' $(GO) run ./scripts/testprogress $(TESTFLAGS) ./...
	@echo "== umbp's scheduler tests, lookups through grpc-go"
	@UMBP_TEST_GRPC_LOOKUPS=1 GO='$(GO)' $(GO) run ./scripts/testprogress $(TESTFLAGS) -run '$(SCHEDULER_TESTS)' ./umbp
	@set -e; for m in $(MODULES); do echo "== $$m"; GO='$(GO)' $(GO) run ./scripts/testprogress -C $$m $(TESTFLAGS) ./...; done

test-short:
	$(GO) test -short -count=1 ./...

# The first build compiles gRPC and the rest of the module: a minute or two.
# The demo starts bin/umbp-standalone-server as a child process and signals it.
demo:
	@echo "building examples/offload and the server (the first build takes a minute or two)..."
	@$(GO) build -o bin/ ./examples/offload
	@$(GO) build -C cmd/umbp-standalone-server -o ../../bin/ .
	@bin/offload

# The operator's tool (ping, lookup, key, clear, bench) as bin/umbp, and the
# Go server as bin/umbp-standalone-server.
tool:
	$(GO) build -C cmd/umbp -o ../../bin/ .
	$(GO) build -C cmd/umbp-standalone-server -o ../../bin/ .

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 5 ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^proto/umbppb/')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@sc=$$($(TOOL) staticcheck) && $$sc ./...
	@set -e; sc=$$($(TOOL) staticcheck); for m in $(MODULES); do (cd $$m && $(GO) vet ./... && $$sc ./...); done

# Fuzz every fuzz target of the module (every decoder and validator) for
# FUZZTIME each (a duration, or Nx for N inputs; FUZZ=regexp picks
# targets). It fails only on a written crasher (or a failure that is not a
# fuzzing result, such as a build error): scripts/fuzz.sh says how it tells
# Go 1.26's coordinator deadline race from a crash. Their seed corpora run
# in every `make test`.
FUZZTIME ?= 20s
FUZZ ?= .
# The tool's targets are in a module of its own (go.work finds it).
fuzz:
	@GO='$(GO)' FUZZTIME='$(FUZZTIME)' FUZZ='$(FUZZ)' PKGS='./... ./cmd/umbp/...' scripts/fuzz.sh

# Fails when the repository tracks build output: an executable binary, or a
# file over 1 MiB outside testdata (.ci/tree-exceptions names the others,
# each with its reason). CI runs it before the tests.
check-tree:
	@scripts/check-tree.sh

protoc-install:
	@if ! $(PROTOC) --version 2>/dev/null | grep -q 'libprotoc $(PROTOC_VERSION)'; then \
	  apt-get update -qq && apt-get install -y -qq protobuf-compiler=$(PROTOC_VERSION)-\* >/dev/null; fi
	@$(PROTOC) --version

proto: protoc-install
	$(PROTOC) -I proto \
	  --plugin=protoc-gen-go=$$($(TOOL) protoc-gen-go) \
	  --plugin=protoc-gen-go-grpc=$$($(TOOL) protoc-gen-go-grpc) \
	  --go_out=proto/umbppb --go_opt=paths=source_relative \
	  --go-grpc_out=proto/umbppb --go-grpc_opt=paths=source_relative \
	  proto/umbp_common.proto proto/umbp_standalone.proto proto/umbp_master.proto

# Fails when the committed generated code differs from what `make proto` makes.
proto-check: proto
	git diff --exit-code -- proto/umbppb

clean:
	$(GO) clean -testcache

# The GPU check, for a host with a GPU and neither Go nor network: test
# binaries, the server, run.sh (scripts/gpu-check.sh) and steps.sh
# (scripts/gpu-steps.sh) in dist/gpu-check/, and dist/gpu-all.sh, which runs
# this bundle and dist/gpu-race/. Copy dist/ to the GPU host and run
# dist/gpu-all.sh LOGDIR there (or dist/gpu-check/run.sh alone).
GPU_CHECK := dist/gpu-check
.PHONY: gpu-check gpu-race gpu-all
gpu-check:
	rm -rf $(GPU_CHECK) && mkdir -p $(GPU_CHECK)
	CGO_ENABLED=1 GOARCH=amd64 $(GO) test -c -ldflags='-s -w' -o $(GPU_CHECK)/hip.test ./internal/hip
	CGO_ENABLED=1 GOARCH=amd64 $(GO) test -c -ldflags='-s -w' -o $(GPU_CHECK)/server.test ./internal/server
	CGO_ENABLED=1 GOARCH=amd64 $(GO) test -c -ldflags='-s -w' -o $(GPU_CHECK)/umbp.test ./umbp
	CGO_ENABLED=1 GOARCH=amd64 $(GO) build -C cmd/umbp-standalone-server -ldflags='-s -w' -o $(CURDIR)/$(GPU_CHECK)/umbp-standalone-server .
	install -m 0755 scripts/gpu-check.sh $(GPU_CHECK)/run.sh
	install -m 0644 scripts/gpu-steps.sh $(GPU_CHECK)/steps.sh
	install -m 0755 scripts/gpu-all.sh dist/gpu-all.sh
	(git describe --always --dirty 2>/dev/null || echo unknown) >$(GPU_CHECK)/BUILD

# The same GPU tests under the race detector, worker and server both: test
# binaries, the server, run.sh (scripts/gpu-race.sh) and steps.sh in
# dist/gpu-race/, and dist/gpu-all.sh.
GPU_RACE := dist/gpu-race
gpu-race:
	rm -rf $(GPU_RACE) && mkdir -p $(GPU_RACE)
	CGO_ENABLED=1 GOARCH=amd64 $(GO) test -race -c -ldflags='-s -w' -o $(GPU_RACE)/server.test ./internal/server
	CGO_ENABLED=1 GOARCH=amd64 $(GO) test -race -c -ldflags='-s -w' -o $(GPU_RACE)/umbp.test ./umbp
	CGO_ENABLED=1 GOARCH=amd64 $(GO) build -C cmd/umbp-standalone-server -race -ldflags='-s -w' -o $(CURDIR)/$(GPU_RACE)/umbp-standalone-server .
	install -m 0755 scripts/gpu-race.sh $(GPU_RACE)/run.sh
	install -m 0644 scripts/gpu-steps.sh $(GPU_RACE)/steps.sh
	install -m 0755 scripts/gpu-all.sh dist/gpu-all.sh
	(git describe --always --dirty 2>/dev/null || echo unknown) >$(GPU_RACE)/BUILD

# Both bundles, and both in dist/gpu-bundles.tar.gz (about 40 MB, where
# the directories are 100): on the GPU host, from the directory that holds
# dist/, dist/gpu-all.sh LOGDIR runs them (under 7 minutes for both,
# whatever happens), from the directories or, where they are absent, from
# the archive beside it.
gpu-all: gpu-check gpu-race
	tar -C dist -czf dist/gpu-bundles.tar.gz gpu-check gpu-race
