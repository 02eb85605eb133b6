# Build, test and demo targets. `make demo` and `make test` are the two
# commands the README promises work on a fresh machine with Go installed.
GO      ?= go
BENCH_RUNS ?= 5
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.Version=$(VERSION)
export ETCD_BIN_DIR := $(CURDIR)/.tools/bin

.PHONY: all build etcd test unit integration race vet fmt-check bench bench-smoke demo clean

all: build

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/confd .
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/kube-apiserver-safe-restart ./safe-restart

# A pinned etcd server and etcdctl, built from the Go module proxy.
etcd:
	./scripts/build-etcd.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# Unit and integration tests; integration tests start real etcd servers on
# 127.0.0.1 and drive the built binaries.
test: etcd build fmt-check vet
	$(GO) test -count=1 -timeout 20m ./...

unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /integration)

integration: etcd build
	$(GO) test -count=1 -timeout 20m ./integration/...

race: etcd
	$(GO) test -race -count=1 -timeout 30m ./...

# The issue-10 harness: its own etcd, every target's scenario several times,
# one table, bench/results.md. CONFD_REF=path runs another confd beside ours.
# Then the Go benchmarks (allocations included).
bench: etcd build
	$(GO) run ./bench -runs $(BENCH_RUNS)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./...

# The harness with tiny data and one run: proves it works, measures nothing.
bench-smoke: etcd build
	$(GO) run ./bench -smoke -out ''


demo: etcd build
	./scripts/demo.sh

clean:
	rm -rf bin .tools
