# Build, test and demo targets. `make demo` and `make test` are the two
# commands the README promises work on a fresh machine with Go installed.
GO      ?= go
BENCH_RUNS ?= 5
# The version, the commit and its date that --version prints, from git
# (scripts/version.sh says which forms and why they sort as dpkg sorts);
# DATE is SOURCE_DATE_EPOCH when set, so that a rebuild is byte for byte
# the same. Each is computed once (:=), and may be given on the command line.
VERSION ?= $(shell scripts/version.sh version)
COMMIT  ?= $(shell scripts/version.sh commit)
DATE    ?= $(shell scripts/version.sh date)
VERSION := $(VERSION)
COMMIT  := $(COMMIT)
DATE    := $(DATE)
VERSION_PKG := github.com/keysync/confd/internal/version
LDFLAGS := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Commit=$(COMMIT) -X $(VERSION_PKG).Date=$(DATE)
# The etcd servers the tests run on, built by `make etcd` into
# .tools/etcd-VERSION/; the default one is on ETCD_BIN_DIR for every test.
# ETCD_DEFAULT is internal/toolbin's EtcdDefault too (a test checks it), so
# that `go test` alone runs on the same etcd.
# 3.4 comes from Debian's package (or $$ETCD34_BIN): see docs/development.md.
ETCD_VERSIONS ?= 3.5.21 3.6.16 3.7.3
ETCD_DEFAULT  ?= 3.6.16
export ETCD_VERSIONS
export ETCD_BIN_DIR ?= $(CURDIR)/.tools/etcd-$(ETCD_DEFAULT)
ETCD34_DIR := $(dir $(or $(ETCD34_BIN),/usr/bin/etcd))

PREFIX     ?= /usr/local
DESTDIR    ?=
SYSTEMDDIR ?= /etc/systemd/system
INSTALL    ?= install

.PHONY: all build print-version etcd kube-apiserver kube-controller-manager test unit integration integration-all rehearsal rehearsal-core-all race vet fmt-check lint bench bench-smoke demo install install-files dist nfpm clean

all: build

# Static binaries, as confd 0.16's releases were (CGO_ENABLED=0): they run
# on any master whatever its libc, and do not map libc (1.4 MB of resident
# memory per process). internal/testbin builds the tests' binaries the
# same way.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/confd ./cmd/confd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/kube-apiserver-safe-restart ./cmd/kube-apiserver-safe-restart
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/kube-apiserver-sa-signer ./cmd/kube-apiserver-sa-signer

# What `make build` stamps, one per line (the version first).
print-version:
	@echo $(VERSION)
	@echo $(COMMIT)
	@echo $(DATE)

# Pinned etcd servers and etcdctl, built from the Go module proxy, one
# directory per version.
etcd:
	./scripts/build-etcd.sh $(ETCD_VERSIONS)

# A pinned kube-apiserver, built from the Go module proxy, for the rehearsal.
kube-apiserver:
	./scripts/build-kube-apiserver.sh

# The same for kube-controller-manager (~93 s once kube-apiserver's build
# cache is warm), for the controller-manager rehearsal.
kube-controller-manager:
	KUBE_CMD=kube-controller-manager ./scripts/build-kube-apiserver.sh

# The binaries into $(DESTDIR)$(PREFIX)/bin, one kind of master's systemd
# units (KIND=binary: kube-apiserver as a systemd unit; KIND=kubeadm: as a
# static pod) into $(DESTDIR)$(SYSTEMDDIR), and every example, both kinds'
# units and the kube-apiserver.service.d drop-ins included, into
# $(DESTDIR)$(DOCDIR)/examples, to copy from. Nothing is armed: no unit is
# enabled, no drop-in is on systemd's unit path, and /etc/confd and
# /etc/kubernetes are the site's and never written (scripts/install.sh
# says why each file goes where it goes). install-files installs what
# $(BIN) holds without building, as make dist does for each architecture.
KIND   ?= binary
DOCDIR ?= $(PREFIX)/share/doc/keysync
BIN    ?= bin
install: build
	@$(MAKE) --no-print-directory install-files
install-files:
	KIND=$(KIND) BIN=$(BIN) DESTDIR=$(DESTDIR) PREFIX=$(PREFIX) SYSTEMDDIR=$(SYSTEMDDIR) DOCDIR=$(DOCDIR) scripts/install.sh

# Release artifacts in $(DIST) (dist/): the three static binaries for each of
# DIST_ARCHES (dist/NAME-linux-ARCH), a .deb and an .rpm per architecture,
# and SHA256SUMS of them all. Each package is what `make install-files
# KIND=binary PREFIX=/usr SYSTEMDDIR=/usr/lib/systemd/system` stages for
# that architecture, packaged by nfpm (packaging/nfpm.yaml): units not
# enabled, drop-ins and kubeadm units under /usr/share/doc/keysync/examples.
# Reproducible: the binaries are stamped with the commit's date and every
# file's time is SOURCE_DATE_EPOCH (the commit's when unset), so a rebuild
# of a commit gives the same SHA256SUMS. nfpm is a pinned tool built from
# the Go module proxy into .tools/bin, as staticcheck is, not a module
# dependency: nothing of it can reach the shipped binaries.
NFPM_VERSION ?= v2.48.0
NFPM        := .tools/bin/nfpm@$(NFPM_VERSION)
DIST_ARCHES ?= amd64 arm64
DIST_CMDS   := confd kube-apiserver-safe-restart kube-apiserver-sa-signer
DIST        ?= dist

.tools/bin/nfpm@%:
	GOFLAGS=-mod=mod GOBIN=$(CURDIR)/.tools/bin/.install-nfpm $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$*
	mv .tools/bin/.install-nfpm/nfpm $@ && rmdir .tools/bin/.install-nfpm

nfpm: $(NFPM)

dist: $(NFPM)
	rm -rf $(DIST)
	@set -e; epoch=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct)}; \
	for arch in $(DIST_ARCHES); do \
		stage=$(DIST)/.build/$$arch; \
		for b in $(DIST_CMDS); do \
			echo "build $$stage/bin/$$b (linux/$$arch)"; \
			CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $$stage/bin/$$b ./cmd/$$b; \
			cp $$stage/bin/$$b $(DIST)/$$b-linux-$$arch; \
		done; \
		$(MAKE) --no-print-directory install-files KIND=binary BIN=$$stage/bin DESTDIR=$(abspath $(DIST))/.build/$$arch/root \
			PREFIX=/usr SYSTEMDDIR=/usr/lib/systemd/system DOCDIR=/usr/share/doc/keysync; \
		find $$stage/root $(DIST)/*-linux-$$arch -exec touch -h -d @$$epoch {} +; \
		for p in deb rpm; do \
			SOURCE_DATE_EPOCH=$$epoch VERSION=$(VERSION) ARCH=$$arch STAGE=$$stage/root $(NFPM) package -f packaging/nfpm.yaml -p $$p -t $(DIST)/; \
		done; \
	done; \
	rm -rf $(DIST)/.build; \
	cd $(DIST) && sha256sum $$(ls) >SHA256SUMS && cat SHA256SUMS

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# Static checks beyond vet: staticcheck's default checks, and functions that
# nothing reaches from the three commands, the bench harness or any test
# (deadcode -test): the tests are part of the product, so a helper only a
# test calls is alive, and one nothing calls is not. Both see the files
# behind the rehearsal's and the bench smoke test's build tags, so that what
# only those use is not reported; not the race tag, which would rebuild the
# standard library and every dependency with it for one init. The tools
# are built from the Go module proxy at pinned versions into .tools/bin,
# one file per version, so that a version bump rebuilds them.
STATICCHECK_VERSION ?= v0.8.2
DEADCODE_VERSION    ?= v0.53.0
LINT_TAGS           := rehearsal,benchsmoke
STATICCHECK := .tools/bin/staticcheck@$(STATICCHECK_VERSION)
DEADCODE    := .tools/bin/deadcode@$(DEADCODE_VERSION)

.tools/bin/staticcheck@%:
	GOFLAGS=-mod=mod GOBIN=$(CURDIR)/.tools/bin/.install-staticcheck $(GO) install honnef.co/go/tools/cmd/staticcheck@$*
	mv .tools/bin/.install-staticcheck/staticcheck $@ && rmdir .tools/bin/.install-staticcheck

.tools/bin/deadcode@%:
	GOFLAGS=-mod=mod GOBIN=$(CURDIR)/.tools/bin/.install-deadcode $(GO) install golang.org/x/tools/cmd/deadcode@$*
	mv .tools/bin/.install-deadcode/deadcode $@ && rmdir .tools/bin/.install-deadcode

lint: $(STATICCHECK) $(DEADCODE)
	$(STATICCHECK) -tags $(LINT_TAGS) ./...
	@echo "$(DEADCODE) -tags $(LINT_TAGS) -test ./..."
	@out=$$($(DEADCODE) -tags $(LINT_TAGS) -test ./...) || exit 1; \
	if [ -n "$$out" ]; then echo "unreachable from the commands, the bench and the tests (deadcode -test):"; echo "$$out"; exit 1; fi

# Every unit and integration test once, under the race detector (the lock,
# watch and command code is concurrent, and a race found here costs less
# than one found on a master), then the full fleet rehearsal. Integration
# tests start real etcd servers on 127.0.0.1 and drive the built binaries;
# packaging's TestDist runs make dist for amd64 with nfpm (about 20 s warm).
test: etcd kube-apiserver kube-controller-manager nfpm build fmt-check vet
	$(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) rehearsal

# Four fleets of three masters on one machine, side by side, running the
# shipped examples with real kube-apiservers, each fleet on a TLS etcd of
# its own (rehearsal/README.md). Its prerequisites build everything it
# runs; under CI=true a missing binary fails it.
REHEARSAL_RUN  ?= TestRehearsal
REHEARSAL_TEST = KUBE_APISERVER_BIN=$(CURDIR)/.tools/bin/kube-apiserver \
	KUBE_CONTROLLER_MANAGER_BIN=$(CURDIR)/.tools/bin/kube-controller-manager \
	$(GO) test -tags rehearsal -count=1 -timeout 30m -parallel 4 -v ./rehearsal/
rehearsal: etcd kube-apiserver kube-controller-manager
	$(REHEARSAL_TEST) -run '$(REHEARSAL_RUN)'

# The rehearsal's core scenarios, run on every tested etcd server (3.4 where
# it exists, as integration-all does), side by side as the fleets of one
# rehearsal are; each version's log is printed whole once all have ended.
# Anchored, so that only the first fleet runs and `rotate` leaves out
# rotate-abort and rotate-rollback; \z, not a dollar sign, which make would
# expand.
REHEARSAL_CORE ?= TestRehearsal\z/^(fresh|converged|rotate|bad-keys|own-key-missing)\z
rehearsal-core-all: etcd kube-apiserver kube-controller-manager
	@logs=$$(mktemp -d); pids=""; n=0; \
	for d in $(foreach v,$(ETCD_VERSIONS),$(CURDIR)/.tools/etcd-$(v)/) $(ETCD34_DIR); do \
		if [ ! -x $${d}etcd ]; then echo "!! SKIPPED: the rehearsal's core scenarios on etcd 3.4: no $${d}etcd"; continue; fi; \
		n=$$((n+1)); echo "== rehearsal core scenarios on $$($${d}etcd --version | head -1)" >$$logs/$$n; \
		ETCD_BIN_DIR=$$d $(REHEARSAL_TEST) -run '$(REHEARSAL_CORE)' >>$$logs/$$n 2>&1 & pids="$$pids $$!"; \
	done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	cat $$logs/*; rm -rf $$logs; exit $$rc

# The fast loop: every package's tests with nothing but Go, nothing built
# first. Tests that need etcd or kube-apiserver run on what `make etcd` and
# `make kube-apiserver` built (never on one that happens to be on $$PATH);
# without it they skip with one line naming the target, or fail under
# CI=true (internal/toolbin).
unit:
	$(GO) test ./...

integration: etcd kube-apiserver
	$(GO) test -count=1 -timeout 20m ./integration/...

# The integration tests on every tested etcd server: each built version, and
# 3.4 where Debian's package (or $$ETCD34_BIN) has it; without it, one loud
# line (CI installs it and fails without it, see .ci/run).
integration-all: etcd kube-apiserver
	@for v in $(ETCD_VERSIONS); do \
		echo "== integration tests on etcd $$v"; \
		ETCD_BIN_DIR=$(CURDIR)/.tools/etcd-$$v $(GO) test -count=1 -timeout 20m ./integration/... || exit 1; \
	done
	@if [ -x $(ETCD34_DIR)etcd ]; then \
		echo "== integration tests on etcd 3.4 ($(ETCD34_DIR)etcd)"; \
		ETCD_BIN_DIR=$(ETCD34_DIR) $(GO) test -count=1 -timeout 20m ./integration/... || exit 1; \
	else \
		echo "!! SKIPPED: the integration tests on etcd 3.4: no $(ETCD34_DIR)etcd (apt-get install etcd-server, or set ETCD34_BIN)"; \
	fi

# The same suite as make test's first step, without the rehearsal.
race: etcd kube-apiserver nfpm
	$(GO) test -race -count=1 -timeout 30m ./...

# The performance harness: its own etcd, every target's scenario several
# times, one table into bench/results.md's results block.
# CONFD_REF=path runs confd 0.16 beside ours, CONFD_FORK=path the maintained
# fork (abtreece/confd) in target 1.
# Then the Go benchmarks (allocations included).
bench: etcd build
	$(GO) run ./bench -runs $(BENCH_RUNS)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./...

# The harness with tiny data and one run: proves it works, measures nothing.
# Not part of make test (CI runs it).
bench-smoke: etcd build
	$(GO) test -tags benchsmoke -count=1 -run TestSmoke -v ./bench


demo: etcd build
	./scripts/demo.sh

clean:
	rm -rf bin .tools
