# Sluice — build and test entry points. GNU make.
#
#   make test          everything CI runs: vet, the race-enabled test suite,
#                      then the xcaddy build check
#   make run           the demo of Caddyfile.example on localhost:8080
#   make build         bin/caddy: stock Caddy plus this plugin
#   make xcaddy-check  build with xcaddy as users do and check the binary
#   make fmt | vet     gofmt the tree | go vet ./...
#   make bench         the benchmark harness (bench/README.md), a few minutes
#   make bench-adaptive  the adaptive concurrency testbed's table (docs/adaptive.md)

GO        ?= go
TESTFLAGS ?= -race -count=1 -timeout 20m
PKGS      ?= ./...
CADDYFILE ?= Caddyfile.example

.DEFAULT_GOAL := test
# Steps run in the order written, even under make -j.
.NOTPARALLEL:
.PHONY: test test-deps go-test alloc-test run build xcaddy-check fmt fmt-check vet clean bench bench-adaptive

# test is the README's test command and what .ci/run calls.
test: vet test-deps go-test alloc-test xcaddy-check

# test-deps prepares what the tests need outside Go (scripts/test-deps.sh:
# redis-server, redis-cli and redis-sentinel, chromium for the browser
# tests, prometheus and promtool for observability/, installed with apt-get
# when missing and root; the tests start their own servers on free ports).
test-deps:
	bash scripts/test-deps.sh

go-test:
	$(GO) test $(TESTFLAGS) $(PKGS)

# alloc-test runs the allocation-count tests once more without -race: the
# race detector makes sync.Pool drop items, so some counts are only the
# program's in a normal build (those tests skip themselves under -race).
alloc-test:
	$(GO) test -count=1 -run 'Alloc' . ./algorithms/ ./identity/ ./memstore/ ./redisstore/

run:
	$(GO) run ./cmd/caddy run --config $(CADDYFILE)

build:
	$(GO) build -o bin/caddy ./cmd/caddy

xcaddy-check:
	bash scripts/xcaddy-check.sh

fmt:
	gofmt -s -w .

# fmt-check fails when a file is not gofmt-clean (not part of test yet).
fmt-check:
	@out="$$(gofmt -s -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

# bench builds the plugin's Caddy, starts its own Redis and Caddy on free
# loopback ports, interleaves wrk and redis-benchmark over a few rounds, runs
# the Go benchmarks, and writes bench/results/<timestamp>.md and
# bench/RESULTS.md (bench/run.sh; knobs BENCH_* in bench/README.md).
bench: bench-adaptive
	bash bench/run.sh

# bench-adaptive runs the adaptive controllers, no limit and a fixed limit
# on the testbed (adaptive/testbed_test.go: a virtual clock, so the table is
# the same on any machine) and prints the table of docs/adaptive.md.
bench-adaptive:
	$(GO) test -count=1 -v -run '^TestTestbed(HeavyTail|Shift|NoisyHost|LongResponses|Bimodal)?$$' ./adaptive/ -args -testbed.table

clean:
	rm -rf bin
