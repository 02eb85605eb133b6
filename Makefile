# Build, test and demo targets. `make demo` and `make test` are the two
# commands the README promises work on a fresh machine with Go installed.
GO      ?= go
BENCH_RUNS ?= 5
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.Version=$(VERSION)
export ETCD_BIN_DIR := $(CURDIR)/.tools/bin

PREFIX     ?= /usr/local
DESTDIR    ?=
SYSTEMDDIR ?= /etc/systemd/system
INSTALL    ?= install

.PHONY: all build etcd kube-apiserver kube-controller-manager test unit integration rehearsal race vet fmt-check bench bench-smoke demo install clean

all: build

# Static binaries, as confd 0.16's releases were (CGO_ENABLED=0): they run
# on any master whatever its libc, and do not map libc (1.4 MB of resident
# memory per process). internal/testbin builds the tests' binaries the
# same way.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/confd .
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/kube-apiserver-safe-restart ./safe-restart

# A pinned etcd server and etcdctl, built from the Go module proxy.
etcd:
	./scripts/build-etcd.sh

# A pinned kube-apiserver, built from the Go module proxy, for the rehearsal.
kube-apiserver:
	./scripts/build-kube-apiserver.sh

# The same for kube-controller-manager (~93 s once kube-apiserver's build
# cache is warm), for the controller-manager rehearsal.
kube-controller-manager:
	KUBE_CMD=kube-controller-manager ./scripts/build-kube-apiserver.sh

# Both binaries into $(DESTDIR)$(PREFIX)/bin and the systemd units into
# $(DESTDIR)$(SYSTEMDDIR), their /usr/local/bin paths pointed at $(PREFIX)/bin.
install: build
	$(INSTALL) -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SYSTEMDDIR)
	$(INSTALL) -m 0755 bin/confd bin/kube-apiserver-safe-restart $(DESTDIR)$(PREFIX)/bin/
	$(INSTALL) -d $(DESTDIR)$(SYSTEMDDIR)/kube-apiserver.service.d
	for u in examples/systemd/*.service examples/systemd/*.path examples/systemd/*.timer examples/systemd/*.service.d/*.conf; do \
		d="$(DESTDIR)$(SYSTEMDDIR)/$${u#examples/systemd/}"; \
		sed 's|/usr/local/bin/|$(PREFIX)/bin/|g' "$$u" >"$$d.tmp" && chmod 0644 "$$d.tmp" && mv "$$d.tmp" "$$d" || exit 1; \
	done

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# Unit and integration tests; integration tests start real etcd servers on
# 127.0.0.1 and drive the built binaries.
test: etcd build fmt-check vet
	$(GO) test -count=1 -timeout 20m ./...
	$(MAKE) rehearsal

# Three masters on one machine running the shipped examples with real
# kube-apiservers on one TLS etcd (rehearsal/README.md). Never skipped:
# without kube-apiserver or etcd it fails.
REHEARSAL_ETCD ?=
REHEARSAL_RUN  ?= TestRehearsal
rehearsal: etcd kube-apiserver build
	KUBE_APISERVER_BIN=$(CURDIR)/.tools/bin/kube-apiserver REHEARSAL_ETCD=$(REHEARSAL_ETCD) \
		$(GO) test -tags rehearsal -count=1 -timeout 30m -v -run '$(REHEARSAL_RUN)' ./rehearsal/

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
