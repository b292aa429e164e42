# The two commands: `make run` and `make test`. Both install what is
# missing (scripts/setup-host.sh), build, and bake the default template.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

DATA_DIR ?= /var/lib/hatchery
TEMPLATES_DIR ?= $(DATA_DIR)/templates
LISTEN ?= 127.0.0.1:7423
BIN := target/release
# Read-only things the suites share across tests and runs (venvs, npm trees,
# wheels, baked template checkpoints, the agent template's rootfs), keyed by
# the hash of what produced them; safe to delete (docs/testing.md).
export HATCHERY_TEST_CACHE ?= /var/cache/hatchery-test
CACHE := /usr/bin/python3 $(CURDIR)/tests/cache.py
# pip's and npm's download caches there too (every `npm ci` of the suites).
export PIP_CACHE_DIR ?= $(HATCHERY_TEST_CACHE)/pip
export npm_config_cache ?= $(HATCHERY_TEST_CACHE)/npm-cache
# Every pytest suite: a per-test timeout (pytest-timeout; a test that needs
# longer says so with @pytest.mark.timeout), so a hang fails fast.
export PYTEST_TIMEOUT ?= 600
PYTEST := /usr/bin/python3 -m pytest -p timeout
# What a suite target needs first; tests/run_suites.py empties these, since
# `make test` has built everything once before the first suite.
SUITE_PREREQS ?= build template
SUITE_BUILD ?= build

.PHONY: install soak-memory pg-conformance test-pg test-pg-integration egress-test agent-template full-template gateway-test rounds-pages-check rounds-pages-build rounds-test setup build template run test unit kernel-test lint integration cli-test client-test sdk-python-test sdk-typescript-test terminal-check terminal-build terminal-test playground-test playground-load sessions-test e2b-test store-test broker-test bench bench-code clean-state

setup:
	bash scripts/setup-host.sh

build: setup
	cargo build --release --workspace

template: build
	$(BIN)/hatchery template build-local --templates-dir $(TEMPLATES_DIR) templates/code-interpreter.json

# Templates the daemon builds in the background once it serves (after the
# default one, which `template` makes before it starts): creates naming
# one answer 503 template_building with Retry-After until it is done.
# BUILD_TEMPLATES= starts without them. code-interpreter-full (numpy,
# pandas, matplotlib, IPython, Node: E2B's code-interpreter-v1 contents)
# is the bigger one and comes second.
BUILD_TEMPLATES ?= templates/base.json templates/code-interpreter-full.json
run: build template
	$(BIN)/hatcheryd --listen $(LISTEN) --data-dir $(DATA_DIR) --templates-dir $(TEMPLATES_DIR) \
	  $(addprefix --build-template ,$(BUILD_TEMPLATES))

# `make install`: the binaries to $(PREFIX)/bin (where the systemd units
# run them), a unit per role (hatchery.service for `all`,
# hatchery-control.service, hatchery-host.service), and each role's example
# config as $(SYSCONFDIR)/<role>.toml.example (never over an operator's
# file). DESTDIR prefixes every path (packaging, or a test's scratch root:
# tests/cli/test_install.py). INSTALL_PREREQS= installs what is built.
PREFIX ?= /opt/hatchery
SYSCONFDIR ?= /etc/hatchery
UNITDIR ?= /etc/systemd/system
INSTALL_PREREQS ?= build
INSTALL_BINS := hatcheryd hatchery hatchery-agent hatchery-shim
install: $(INSTALL_PREREQS)
	install -d -m 0755 $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR)
	install -d -m 0750 $(DESTDIR)$(SYSCONFDIR)
	install -m 0755 $(addprefix $(BIN)/,$(INSTALL_BINS)) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 deploy/systemd/hatchery.service deploy/systemd/hatchery-control.service \
	  deploy/systemd/hatchery-host.service $(DESTDIR)$(UNITDIR)/
	for role in all control host; do \
	  install -m 0600 deploy/config/$$role.toml $(DESTDIR)$(SYSCONFDIR)/$$role.toml.example; \
	done
	@echo "installed under $(DESTDIR)$(PREFIX) and $(DESTDIR)$(SYSCONFDIR); next: docs/operations.md, Install"

lint:
	cargo fmt --all -- --check
	/usr/bin/python3 scripts/module_cycles.py
	sh scripts/daemon_size.sh
	cargo clippy --workspace --all-targets --release -- -D warnings

# The test binaries: libraries, binaries, crate tests (the examples are
# checked by clippy and built by the benches; `cargo test` would also link
# each of them). Same profile and features as `make build`, so they reuse
# every library it compiled.
RUST_TESTS = --workspace --release --lib --bins --tests

# fmt, clippy and every Rust unit and crate test (no root, no runsc). The
# PostgreSQL conformance suites run once, in make pg-conformance, on one
# shared server.
unit: lint
	cargo test $(RUST_TESTS) -- --skip conformance_on_postgres
	cargo test --workspace --release --doc

# The run_code Python kernel, on the host's python3 (no build, no daemon).
kernel-test:
	$(PYTEST) -q -p no:cacheprovider tests/kernel

integration: $(SUITE_PREREQS)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/integration

# The whole suite again with every daemon's state in one private
# PostgreSQL (tests/pg/pg.py; each daemon a host of its own on it): every
# suite of `make test` that starts a daemon (store-test runs on PostgreSQL
# in `make test` already). About 25 minutes on a quiet host (35 under
# load), so not part of `make test`; `make test-pg-integration` is its
# biggest part (about 13 minutes).
PG_SUITES = integration cli-test client-test sdk-python-test sdk-typescript-test terminal-test rounds-test \
  sessions-test broker-test playground-test playground-load gateway-test e2b-test egress-test
test-pg: $(SUITE_PREREQS)
	/usr/bin/python3 tests/pg/pg.py -- sh -c 'HATCHERY_TEST_DB=$$HATCHERY_TEST_PG_DSN /usr/bin/python3 tests/run_suites.py $(PG_SUITES)'

test-pg-integration: $(SUITE_PREREQS)
	/usr/bin/python3 tests/pg/pg.py -- sh -c 'HATCHERY_TEST_DB=$$HATCHERY_TEST_PG_DSN $(MAKE) integration'

# The `hatchery` binary end to end, against a daemon the tests start.
# Every daemon it starts reads its settings from a file (hatcheryd --config).
cli-test: $(SUITE_PREREQS)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) HATCHERY_TEST_CONFIG_FILE=1 \
	  $(PYTEST) -q -p no:cacheprovider tests/cli

# The typed Rust client (crates/hatchery-client) against a live daemon: its
# client_smoke example drives every part of the API (about 10 s).
client-test: $(SUITE_PREREQS)
	cargo build --release -p hatchery-client --example client_smoke
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/client

# The SDK suites drive a daemon of their own (tests/sdk/support.py) built from
# this checkout. Python: the package is pip-installed into a fresh venv, as a
# user would (the venv sees the system pytest). TypeScript: npm ci + build,
# then node's test runner under tests/sdk/with_daemon.py.
SDK_VENV := target/sdk-python-venv

sdk-python-test: $(SUITE_PREREQS)
	rm -rf $(SDK_VENV)
	/usr/bin/python3 -m venv --system-site-packages $(SDK_VENV)
	$(SDK_VENV)/bin/pip install -q --no-index --no-build-isolation ./sdk/python
	rm -rf sdk/python/build sdk/python/*.egg-info
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) HATCHERY_SDK_INSTALLED=1 \
	  $(SDK_VENV)/bin/python -P -m pytest -p timeout -q -p no:cacheprovider -c sdk/python/pytest.ini sdk/python/tests

NEED_NODE = @node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null && command -v npm >/dev/null || \
	  { echo "$@: needs Node.js >= 20 with npm (bookworm has 18; e.g. NodeSource's packages)" >&2; exit 1; }

sdk-typescript-test: $(SUITE_PREREQS)
	$(NEED_NODE)
	cd sdk/typescript && npm ci --no-audit --no-fund --silent && npm run --silent build
	cd sdk/typescript && HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 $(CURDIR)/tests/sdk/with_daemon.py node --test --test-concurrency=1 --test-timeout=300000 test/
	cd sdk/typescript && HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 $(CURDIR)/tests/sessions/with_session_daemon.py node --test --test-concurrency=1 --test-timeout=300000 test-sessions/

# E2B compatibility (docs/e2b.md): the official `e2b` and
# `e2b-code-interpreter` from PyPI in a fresh venv, and `e2b` from npm
# (npm ci from tests/e2b/js/package-lock.json), against a live daemon.
# `base` is built on agent-template's rootfs (the same packages), so CI runs
# debootstrap once for both; `code-interpreter-full` on full-template's.
e2b-test: $(SUITE_PREREQS) agent-template full-template
	$(NEED_NODE)
	E2B_VENV=$$($(CACHE) venv e2b tests/e2b/requirements.txt) && \
	E2B_JS=$$($(CACHE) node-modules e2b-js tests/e2b/js) && \
	HATCHERY_E2B_JS=$$E2B_JS HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  HATCHERY_AGENT_TEMPLATES_DIR=$(AGENT_TEMPLATES_DIR) HATCHERY_FULL_TEMPLATES_DIR=$(FULL_TEMPLATES_DIR) \
	  $$E2B_VENV/bin/python -m pytest -p timeout -q -p no:cacheprovider tests/e2b

# The browser terminal (web/terminal: xterm.js on the PTY WebSocket). The
# daemon embeds web/terminal/dist at compile time, so `make build` needs no
# Node; terminal-check rebuilds the bundle from the sources and the lockfile
# (npm ci, esbuild) and fails if the committed dist/ differs, and
# terminal-build rewrites dist/ (commit it). terminal-test then drives
# /terminal/ in headless Chromium against a real daemon.
terminal-check:
	$(NEED_NODE)
	cd web/terminal && npm ci --no-audit --no-fund --silent && npm run --silent check

terminal-build:
	$(NEED_NODE)
	cd web/terminal && npm ci --no-audit --no-fund --silent && npm run --silent build

terminal-test: terminal-check $(SUITE_PREREQS)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/terminal

# The docs playground: HTTP and browser (headless Chromium) tests, then a
# bounded load test (about 70 s).
playground-test: $(SUITE_PREREQS)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/playground/test_http.py tests/playground/test_network.py tests/playground/test_browser.py

playground-load: $(SUITE_PREREQS)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -s -p no:cacheprovider tests/playground/test_load.py

# The model gateway with the real `openai` and `anthropic` clients (PyPI,
# versions pinned in tests/gateway/requirements.txt) in a venv of their own,
# in front of a scripted upstream, and from inside real sandboxes through the
# daemon's host-service relay (test_from_sandbox.py). About 2 minutes. The
# budget store's conformance suite on PostgreSQL is in `make pg-conformance`.
GATEWAY_VENV = $$($(CACHE) venv gateway tests/gateway/requirements.txt --system-site-packages)

gateway-test: $(SUITE_PREREQS)
	V=$(GATEWAY_VENV) && HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $$V/bin/python -m pytest -p timeout -q -p no:cacheprovider tests/gateway

# Interview rounds (the store's conformance suite on PostgreSQL is in
# `make pg-conformance`, on SQLite in `make unit`): the pages (web/rounds: CodeMirror 6 bundled by esbuild, dist/
# committed and embedded in the daemon): check/build as for the terminal,
# then the candidate room and the reviewer page in headless Chromium,
# the live room with three pages and the reviewer's playback (about 55 s).
# The HTTP suite is tests/integration/test_rounds.py.
rounds-pages-check:
	$(NEED_NODE)
	cd web/rounds && npm ci --no-audit --no-fund --silent && npm run --silent check

rounds-pages-build:
	$(NEED_NODE)
	cd web/rounds && npm ci --no-audit --no-fund --silent && npm run --silent build

rounds-test: rounds-pages-check $(SUITE_PREREQS)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/rounds

# Agent sessions against real sandboxes, a real `git daemon` and the
# scripted model server (about 80 s).
# mini-swe-agent and its pinned dependencies, as wheels, for the
# third-party-agent test's template (installed offline from here).
# mini-swe-agent and its pinned dependencies, as wheels, for the
# third-party-agent test's template (installed offline from the test cache).
sessions-test: $(SUITE_PREREQS)
	W=$$($(CACHE) wheels swe tests/sessions/agent-requirements.txt) && \
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  HATCHERY_AGENT_WHEELS=$$W \
	  $(PYTEST) -q -p no:cacheprovider tests/sessions

# mcp-server-git from PyPI (pinned, with what it pulls in), the real MCP
# server the broker fronts in tests/broker/test_broker_mcp.py.
# moto's S3 server (pinned in tests/broker/s3-requirements.txt), the local
# object store test_broker_s3_anchor.py anchors to.
# The tool broker (tests/broker, about 2.5 minutes; its store's conformance
# suite is in `make pg-conformance` and `make unit`): git push with a write credential to a real git
# http-backend, a forge test server, SIGKILL x20, MCP tools of
# mcp-server-git (about 20 s of it), anchoring to an S3-compatible store.
broker-test: $(SUITE_PREREQS)
	V=$$($(CACHE) venv mcp tests/broker/mcp-requirements.txt) && \
	S3=$$($(CACHE) venv s3 tests/broker/s3-requirements.txt) && \
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  HATCHERY_MCP_VENV=$$V HATCHERY_S3_VENV=$$S3 \
	  $(PYTEST) -q -p no:cacheprovider tests/broker

# The `agent-session` template (curl, git, pip from the Debian mirror), kept
# in the test cache between runs and clones: the egress suite's sessions use it.
AGENT_TEMPLATES_DIR ?= $(HATCHERY_TEST_CACHE)/agent-templates
# build-local is a no-op when the built version is current. Its packages
# are base.json's too: e2b-test seeds `base` from this rootfs. The lock
# (tests/integration/harness.py agent_templates takes it too) keeps
# egress-test and e2b-test, in two lanes, from building it at once.
agent-template: $(SUITE_BUILD)
	mkdir -p $(AGENT_TEMPLATES_DIR)
	flock $(AGENT_TEMPLATES_DIR).lock \
	  $(BIN)/hatchery template build-local --templates-dir $(AGENT_TEMPLATES_DIR) templates/agent-session.json

# The `code-interpreter-full` template's rootfs (numpy, pandas, matplotlib,
# IPython, Node, TypeScript, R, a JDK from the Debian mirror), kept in the test cache
# like agent-template's: e2b-test builds the template on it, so only its
# setup and checkpoint run there. A cold build is a debootstrap of 334
# packages (6 to 19 min here: docs/testing.md); a current one is a no-op.
# `make test` starts it in the background (below).
FULL_TEMPLATES_DIR ?= $(HATCHERY_TEST_CACHE)/full-templates
full-template: $(SUITE_BUILD)
	mkdir -p $(FULL_TEMPLATES_DIR)
	flock $(FULL_TEMPLATES_DIR).lock \
	  $(BIN)/hatchery template build-local --templates-dir $(FULL_TEMPLATES_DIR) templates/code-interpreter-full.json

# Sessions through the daemon's model gateway and egress proxy: pip, git
# over HTTPS and curl inside a session sandbox against servers in a network
# namespace the suite creates (tests/sessions/egress_servers.py)
# (about 20 s once the template is built; the build takes about 3 min).
egress-test: $(SUITE_BUILD) agent-template
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_AGENT_TEMPLATES_DIR=$(AGENT_TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/egress

# Every suite, in two lanes side by side (each lane one suite after another;
# each suite runs even if one before it failed), then a table: suite, tests
# passed/failed/skipped, wall time, and the total (also in
# target/test-times.md; each suite's output in target/test-logs/). What each
# suite proves, and why two lanes are safe: docs/testing.md.
# Lane 1 starts with its short suites and runs integration once lane 0's
# compile-heavy lint and unit are done: the memory-hog test's race (issue
# 34) was lost under a compiler's load.
TEST_SUITES = unit kernel-test store-test sessions-test gateway-test egress-test \
  // cli-test client-test sdk-python-test sdk-typescript-test terminal-test rounds-test e2b-test \
    playground-test playground-load broker-test integration

# code-interpreter-full's rootfs (full-template, for e2b-test) is the one
# slow thing a suite needs that the cache may lack: cold, a debootstrap of
# about 290 packages (docs/testing.md gives the time). It starts here, in the
# background beside the suites and niced, so that it overlaps lane 1's suites
# before e2b-test instead of adding to its lane; e2b-test's own full-template
# prerequisite then waits on its lock and finds it current. With the cache
# warm it is a no-op. Its output: target/test-logs/full-template.log.
test: build template
	mkdir -p target/test-logs
	{ start=$$(date +%s); nice -n 19 $(MAKE) --no-print-directory SUITE_BUILD= full-template \
	    >target/test-logs/full-template.log 2>&1; rc=$$?; \
	  echo "full-template (in the background): exit $$rc after $$(( $$(date +%s) - start )) s" \
	    >>target/test-logs/full-template.log; } & bg=$$!; \
	/usr/bin/python3 tests/run_suites.py $(TEST_SUITES); rc=$$?; \
	wait $$bg; tail -n 1 target/test-logs/full-template.log; exit $$rc

# Every store's conformance suite on PostgreSQL, in one run of the test
# binaries `make unit` built (no build of its own; about 30 s): the broker's
# record, the gateway's budgets and interview rounds on a private PostgreSQL
# (tests/pg/pg.py; HATCHERY_REQUIRE_PG, so none passes by skipping); the
# state, sessions and policy stores start their own (initdb/pg_ctl as the
# postgres user; they fail if they cannot). SQLite runs in `make unit`.
pg-conformance: $(SUITE_BUILD)
	/usr/bin/python3 tests/pg/pg.py -- env HATCHERY_REQUIRE_PG=1 \
	  cargo test $(RUST_TESTS) conformance_on_postgres

# Every store's conformance suite on PostgreSQL (pg-conformance), then hatcheryd --db postgres://
# end to end: restart, two hosts, a fenced host (about 1 minute); then
# tests/store/test_hosts.py: routing to the owning host, the control role's
# placement, SIGKILL and SIGSTOP of a host past its lease (about 2 minutes).
# tests/store/test_faults.py: PostgreSQL SIGKILLed and restarted under two
# hosts, hosts with +/-10 min clock skew under faketime (about 75 s).
# tests/store/test_snapshots_shared.py: --snapshot-store shared:<dir>, a
# snapshot forked on another host after its writer's SIGKILL (about 55 s).
# tests/store/test_rounds_hosts.py: interview rounds on two control
# processes over two hosts, one control SIGKILLed mid-grading (about 20 s).
# tests/store/test_hosts_api.py: cordon, uncordon, 410 sandbox_lost (API,
# Python SDK, CLI, E2B's shape) and the control plane's /readyz over two
# hosts (about 45 s).
# tests/store/test_sessions_graceful.py: SIGTERM of a host with two sessions
# mid-run (both resume on the other host), and a drain through the API
# (about 2 minutes).
store-test: $(SUITE_PREREQS) pg-conformance
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/store

# The Run-button path alone (about a minute): run_code and exec against raw runsc.
bench-code: $(SUITE_PREREQS)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/code_bench.py

# The memory-hog test of integration, 7 rounds of its 7 shapes (49 hogs and
# a run_code hog) on one daemon that has served 300 sandboxes first,
# instead of make test's one round (about 8 minutes; issue 34's soak).
soak-memory: $(SUITE_PREREQS)
	HATCHERY_HOG_ROUNDS=7 HATCHERY_HOG_WARMUP=300 HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/integration/test_adversarial.py -k memory_hogs_of_every_shape

# The live room's load test (issue 41): pycrdt and websockets, pinned in
# bench/room-requirements.txt, in a venv of their own.
ROOM_VENV = $$($(CACHE) venv room bench/room-requirements.txt --system-site-packages)

# make bench prints, before each script or example, its name, the UTC time
# and the load average, so docs/benchmarks.md can say what each figure was
# measured beside. A script that crashes stops make bench (make's own rule).
BENCH_HEAD = @printf '\n=== bench %s · %s · load %s\n' "$(1)" "$$(date -u '+%F %T UTC')" "$$(cut -d' ' -f1-3 /proc/loadavg)"

bench: $(SUITE_PREREQS) agent-template
	cargo build --release -p hatchery-net --example slot_bench
	$(call BENCH_HEAD,policy_bench)
	cargo run -q --release -p hatchery-policy --example policy_bench
	$(call BENCH_HEAD,audit_bench)
	cargo run -q --release -p hatchery-audit --example audit_bench
	$(call BENCH_HEAD,egress_bench)
	cargo run -q --release -p hatchery-egress --example egress_bench
	$(call BENCH_HEAD,intercept_bench)
	cargo run -q --release -p hatchery-sessions --example intercept_bench
	$(call BENCH_HEAD,store_bench)
	cargo run -q --release -p hatchery-store --example store_bench
	$(call BENCH_HEAD,hosts_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/hosts_bench.py
	$(call BENCH_HEAD,sessions_hosts_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/sessions_hosts_bench.py
	$(call BENCH_HEAD,gateway_hosts_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/gateway_hosts_bench.py
	$(call BENCH_HEAD,session_egress_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/session_egress_bench.py
	$(call BENCH_HEAD,bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/bench.py
	$(call BENCH_HEAD,fs_pause_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/fs_pause_bench.py
	$(call BENCH_HEAD,idle_cpu_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/idle_cpu_bench.py
	$(call BENCH_HEAD,playground_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/playground_bench.py
	$(call BENCH_HEAD,code_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/code_bench.py
	cargo build --release -p hatchery-gateway --example reserve_bench
	$(call BENCH_HEAD,reserve_bench)
	/usr/bin/python3 tests/pg/pg.py -- $(BIN)/examples/reserve_bench
	$(call BENCH_HEAD,gateway_bench)
	V=$(GATEWAY_VENV) && HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) /usr/bin/python3 tests/pg/pg.py -- $$V/bin/python bench/gateway_bench.py
	$(call BENCH_HEAD,rounds_fairness)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/rounds_fairness.py
	$(call BENCH_HEAD,room_bench)
	V=$(ROOM_VENV) && HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $$V/bin/python bench/room_bench.py
	$(call BENCH_HEAD,sessions_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/sessions_bench.py
	$(call BENCH_HEAD,checkpoint_cost)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/checkpoint_cost.py
	$(call BENCH_HEAD,environments_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  HATCHERY_AGENT_TEMPLATES_DIR=$(AGENT_TEMPLATES_DIR) /usr/bin/python3 bench/environments_bench.py
	$(call BENCH_HEAD,chain_bench)
	cargo run -q --release -p hatchery-sessions --example chain_bench
	$(call BENCH_HEAD,session_store_bench)
	cargo run -q --release -p hatchery-sessions --example session_store_bench
	$(call BENCH_HEAD,broker_bench)
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/broker_bench.py
