# The two commands: `make run` and `make test`. Both install what is
# missing (scripts/setup-host.sh), build, and bake the default template.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

DATA_DIR ?= /var/lib/hatchery
TEMPLATES_DIR ?= $(DATA_DIR)/templates
LISTEN ?= 127.0.0.1:7423
PYTEST := /usr/bin/python3 -m pytest
BIN := target/release

.PHONY: setup build template run test unit lint integration cli-test bench clean-state

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

# The `hatchery` binary end to end, against a daemon the tests start.
cli-test: build template
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  $(PYTEST) -q -p no:cacheprovider tests/cli

test: build template lint unit integration cli-test

bench: build template
	cargo build --release -p hatchery-net --example slot_bench
	HATCHERY_BIN_DIR=$(CURDIR)/$(BIN) HATCHERY_TEMPLATES_DIR=$(TEMPLATES_DIR) \
	  /usr/bin/python3 bench/bench.py
