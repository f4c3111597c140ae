# tether: the two set-up commands are `make demo` and `make test` (README.md).
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
CMDS := ./admission/cmd/tether-admission ./receiver/cmd/tether-receiver \
	./custodian/cmd/tether-custodian ./plugin/cmd/tether-plugin \
	./qmpinput/cmd/tether-qmp ./fixtures/cmd/tether-hostagent ./fixtures/cmd/tether-demo \
	./fixtures/cmd/tether-witness ./fixtures/cmd/tether-modelserver \
	./computer/cmd/tether-computer ./computer/cmd/tether-vmguest
TEST_TIMEOUT ?= 30m

.PHONY: all build demo test lint bench bench-fleet proto setup clean flakes faults guest-image

all: build

# build compiles every binary that exists into bin/.
build:
	@mkdir -p $(BIN)
	@for c in $(CMDS); do if [ -d $$c ]; then CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ $$c || exit 1; fi; done

# setup installs what the tests need when run as root (idempotent).
setup:
	@if [ "$$(id -u)" = 0 ]; then ci/setup; else echo "make setup: not root; skipping package installs (tests that need them will say so)"; fi

# guest-image builds the VM computers' guest image from Debian packages
# into the tether cache (ci/guestimage; ci/setup runs it too), as root.
guest-image:
	@ci/guestimage

# demo runs the main job: the computer service's life cycle (a create
# from the warm pool, a lease, suspend and resume, an expiry, and egress:
# one allowed and one refused fetch against a lab network it starts) with
# the service embedded, then the whole chain on a disposable computer.
demo: build
	@$(BIN)/tether-computer demo
	@$(BIN)/tether-demo run

# test runs the whole suite, and every benchmark once (-benchtime 1x) so a
# benchmark that breaks or skips fails here too (figures come from make
# bench); ci/testreport prints the last 30 lines of each failure and every
# skip, and fails on a skip when TETHER_TEST_REQUIRE is set (as .ci/run
# does). The evidence stays in .cache/: test.json (every event) and
# test-failures.txt (each failed test's whole output).
test: setup
	@mkdir -p .cache
	@set -o pipefail; $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -bench . -benchtime 1x -json ./... \
		| tee .cache/test.json | $(GO) run ./ci/testreport -failures .cache/test-failures.txt

# flakes is the flake hunt (not part of .ci/run): every package's tests
# FLAKES_COUNT times with -race, report in .cache/flakes/report.json.
# More flags: ci/flakes -help (docs/ci.md).
FLAKES_COUNT ?= 20
flakes:
	@ci/flakes -count $(FLAKES_COUNT) $(FLAKES_FLAGS)

# faults is the long churn of computer/faults (not part of make test, which
# runs it with 60 cycles): 1,000 create/delete cycles under client
# disconnects and daemon kills, as root (docs/ci.md).
FAULTS_CYCLES ?= 1000
faults: setup
	@TETHER_FAULTS_CYCLES=$(FAULTS_CYCLES) TETHER_TEST_REQUIRE=root,cgroup-limits,cgroup-freezer,loop \
		$(GO) test -count=1 -timeout 90m -v -run 'TestIntegrationChurn$$' ./computer/faults

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

bench: build
	@ci/bench

# bench-fleet is the computer service's fleet benchmark (long; not in
# bench or test): FLEET_N idle computers at once (default 1000), the host
# memory each takes, the time to make and end them all (ci/bench-fleet).
bench-fleet:
	@ci/bench-fleet

proto:
	@$(MAKE) -C plugin/proto

clean:
	rm -rf $(BIN) .cache

# demo-view starts the computer service, creates a VM computer with a
# screen (create --tier vm --screen) and prints its live view links:
# watch it, take over, hand back. Ctrl-C deletes it.
.PHONY: demo-view
demo-view: build
	@$(BIN)/tether-computer demo-view
