# mailpush — build, run and test. Every target installs what it needs (idempotently).
SHELL := /bin/bash
.DEFAULT_GOAL := help

# iproute2 and iptables: test_network_cut.py runs a member in a network namespace of its own.
APT_PACKAGES := librdkafka-dev libssl-dev libsqlite3-dev libjemalloc-dev kcat openssl iproute2 iptables
PYTHON ?= python3
SWIFT ?= swift
BIN := .build/debug/mailpush
# Black-box tests run side by side (pytest-xdist): each has its own development broker, ports and directories,
# and most of their time is spent waiting on the broker's group rounds, not on the CPU.
TEST_WORKERS ?= 3
# The longest first, one test at a time to each free worker (tests/integration/conftest.py).
BLACK_BOX_TESTS := MAILPUSH_BIN=$(BIN) $(PYTHON) -m pytest -q -n $(TEST_WORKERS) tests/integration tests/chaos/test_chaos_short.py
# A target that imports a module it does not declare fails the build (it would otherwise build only by luck of
# the build order, and break in another configuration). SwiftPM's check accepts modules that arrive through
# another dependency; .ci/check-imports.py also refuses those.
SWIFT_BUILD_FLAGS := --explicit-target-dependency-import-check error
STAMP := .build/.deps-installed

.PHONY: help format lint deps build release run devbroker test test-unit test-integration test-helm chaos chaos-fleet bench soak clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

deps: $(STAMP) ## Install system (apt) and Python test packages, and the multi-buffer RSA library, if missing

$(STAMP): tests/requirements.txt tests/helm/requirements.txt tools/install-crypto-mb Makefile
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages: $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@$(PYTHON) -m pip install -q --disable-pip-version-check -r tests/requirements.txt -r tests/helm/requirements.txt
	@PYTHON=$(PYTHON) tools/install-crypto-mb
	@mkdir -p .build && touch $@

build: deps ## Debug build of the mailpush binary
	$(PYTHON) .ci/check-imports.py
	$(SWIFT) build $(SWIFT_BUILD_FLAGS) --product mailpush

release: deps ## Release build (.build/release/mailpush)
	$(SWIFT) build $(SWIFT_BUILD_FLAGS) -c release --product mailpush

run: build ## Run the service on the embedded development broker (state in ./.mailpush)
	$(BIN) run --log-format text $(ARGS)

devbroker: build ## Run the development broker alone (bootstrap in ./.mailpush/devbroker.bootstrap)
	$(BIN) devbroker --bootstrap-file .mailpush/devbroker.bootstrap

test-helm: deps ## Render the Helm chart with Helm's engine and validate every manifest
	$(PYTHON) -m pytest -q tests/helm

test-integration: build ## Black-box tests: the real binary against a devbroker, checked with independent clients
	$(BLACK_BOX_TESTS)

test-unit: deps ## Swift unit and in-process Kafka tests
	$(PYTHON) .ci/check-imports.py
	$(SWIFT) test $(SWIFT_BUILD_FLAGS)

# The Helm and integration suites run as two pytest sessions (each folder has its own conftest module,
# which one session cannot import twice), then swift test, so the output closes with swift test's
# summary; any failure stops make with a non-zero status.
format: ## Apply the project's swift-format settings (.swift-format) to the Swift sources
	swift-format format -i -r Sources Tests Package.swift

lint: ## Check formatting against .swift-format (part of make test)
	swift-format lint --strict -r Sources Tests Package.swift

test: build lint ## Everything: format check, Helm, integration, crash (short), unit
	$(PYTHON) -m pytest -q tests/helm
	$(BLACK_BOX_TESTS)
	$(SWIFT) test $(SWIFT_BUILD_FLAGS)

# The fleet's members each in a network namespace, some disruptions cutting one off (needs root; CHAOS_CUTS= without).
CHAOS_CUTS ?= --cuts

chaos: build ## Long crash tests: one instance, 100 SIGKILLs (30 pairs); then a fleet of 3, 40 kills/stops/pauses/replacements/cuts and 4 replays; both change the config 10 times
	$(PYTHON) tests/chaos/chaos.py --bin $(BIN) --events 3000 --kills 100 --pairs 30 --batch-size 16 --partitions 32 --config-changes 10 $(CHAOS_ARGS)
	$(PYTHON) tests/chaos/chaos.py --bin $(BIN) --fleet 3 --events 6000 --kills 40 --batch-size 32 --partitions 24 --replays 4 --config-changes 10 $(CHAOS_CUTS) $(CHAOS_ARGS)

chaos-fleet: build ## The fleet part of `make chaos` alone (CHAOS_ARGS to tune)
	$(PYTHON) tests/chaos/chaos.py --bin $(BIN) --fleet 3 --events 6000 --kills 40 --batch-size 32 --partitions 24 --replays 4 --config-changes 10 $(CHAOS_CUTS) $(CHAOS_ARGS)

BENCH_STAMP := .build/.bench-deps-installed

$(BENCH_STAMP): bench/requirements.txt
	@$(PYTHON) -m pip install -q --disable-pip-version-check -r bench/requirements.txt
	@mkdir -p .build && touch $@

bench: deps $(BENCH_STAMP) ## Benchmark (release build): the service (group and static) against the RSA floor and a bare relay → bench/results/
	$(SWIFT) build $(SWIFT_BUILD_FLAGS) -c release --product mailpush
	$(SWIFT) build $(SWIFT_BUILD_FLAGS) -c release --product MailpushBench
	$(PYTHON) bench/bench.py $(BENCH_ARGS)

soak: deps $(BENCH_STAMP) ## Memory over time (release build): 12 minutes of steady load, RSS every 30 s (SOAK_ARGS to tune)
	$(SWIFT) build $(SWIFT_BUILD_FLAGS) -c release --product mailpush
	$(PYTHON) bench/soak.py --bin .build/release/mailpush $(SOAK_ARGS)

clean: ## Remove build output and local state
	rm -rf .build .mailpush
