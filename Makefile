# The two commands: `make run` and `make test`. Both install what is
# missing (scripts/setup-host.sh), build, and bake the default template.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

DATA_DIR ?= /var/lib/hatchery
TEMPLATES_DIR ?= $(DATA_DIR)/templates
LISTEN ?= 127.0.0.1:7423
PYTEST := /usr/bin/python3 -m pytest
BIN := target/release

.PHONY: setup build template run test unit lint integration playground-test playground-load bench clean-state

setup:
	bash scripts/setup-host.sh

build: setup
	cargo build --release --workspace

template: build
	$(BIN)/hatchery template build-local --templates-dir $(TEMPLATES_DIR) templates/code-interpreter.json

run: build template
	$(BIN)/hatcheryd --listen $(LISTEN) --data-dir $(DATA_DIR) --templates-dir $(TEMPLATES_DIR)

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --release -- -D warnings

unit:
	cargo test --workspace --release

integration: build template
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/integration

# The docs playground: HTTP and browser (headless Chromium) tests, then a
# bounded load test (about 70 s).
playground-test: build template
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/playground/test_http.py tests/playground/test_browser.py

playground-load: build template
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -s -p no:cacheprovider tests/playground/test_load.py

test: build template lint unit integration playground-test playground-load

bench: build template
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/bench.py
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/playground_bench.py
