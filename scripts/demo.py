#!/usr/bin/env python3
"""`make run`: three fake apiservers, each behind its own Envoy with the
kube-peer-proxy filter, so a person can watch requests be rerouted.

  a (old apiset) <- Envoy A   peers: b, c
  b (new apiset) <- Envoy B   peers: a, c
  c (new apiset) <- Envoy C   peers: a, b

Envoy A is the interesting one: it fronts the old apiserver, so new-only
resources must be served by b or c. The demo prints curl and kubectl commands
to try against it and runs until Ctrl-C/SIGTERM. With --check it instead runs
the curl commands itself and exits 0 only if every one returned 200, so the
`make run` path can be tested without a person.

Ports: apiservers 16441-3, Envoy listeners 18441-3, admin 19441-3, all shifted
by $KPP_DEMO_BASE (default 0).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.proc import OPENER

ROOT = Path(__file__).resolve().parents[1]
DEMO_DIR = ROOT / ".demo"
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
DISCOVERY_ACCEPT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
# A group that only the "new" apiset serves: once A's merged discovery lists
# it, A has synced its peers and can reroute.
NEW_ONLY_GROUP = "resource.k8s.io"
READY_TIMEOUT = 30.0
NODES = (("a", "old"), ("b", "new"), ("c", "new"))

RESOURCECLAIM_YAML = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: demo-claim
  namespace: default
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.example.com
"""


class Interrupted(Exception):
    """Raised from the SIGINT/SIGTERM handler so `finally` cleans up."""


@dataclass(frozen=True)
class Node:
    name: str
    apiset: str
    apiserver_port: int
    listen_port: int
    admin_port: int


@dataclass(frozen=True)
class Probe:
    """One "what to try" curl command, and how --check runs it."""

    what: str
    url: str
    accept: str | None = None
    show_headers: bool = False
    grep: str | None = None  # regex a body line must match, as `grep -E`

    def curl(self) -> str:
        cmd = ["curl", "-s"]
        if self.show_headers:
            cmd.append("-i")
        if self.accept:
            cmd += ["-H", f"Accept: {self.accept}"]
        cmd.append(self.url)
        text = shlex.join(cmd)
        return f"{text} | grep -E {shlex.quote(self.grep)}" if self.grep else text

    def run(self) -> tuple[bool, str]:
        req = urllib.request.Request(self.url, headers={"Accept": self.accept} if self.accept else {})
        try:
            with OPENER.open(req, timeout=10) as resp:
                status, headers, body = resp.status, resp.headers, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            status, headers, body = e.code, e.headers, e.read().decode("utf-8", "replace")
        except OSError as e:
            return False, f"request failed: {e}"
        detail = f"HTTP {status}"
        if headers.get("x-fake-apiserver"):
            detail += f", x-fake-apiserver: {headers['x-fake-apiserver']}"
        if status != 200:
            return False, detail + f", body: {body[:300]!r}"
        if self.grep and not re.search(self.grep, body, re.MULTILINE):
            return False, detail + f", but no line matches {self.grep!r}"
        return True, detail


def make_nodes(base: int) -> list[Node]:
    return [
        Node(name, apiset, 16441 + i + base, 18441 + i + base, 19441 + i + base)
        for i, (name, apiset) in enumerate(NODES)
    ]


def make_probes(a: Node) -> list[Probe]:
    url = f"http://127.0.0.1:{a.listen_port}"
    return [
        Probe(
            "new-only resource through A: served by b or c",
            f"{url}/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
            show_headers=True,
        ),
        Probe("resource a serves itself: stays on a", f"{url}/apis/apps/v1/deployments", show_headers=True),
        Probe("merged discovery: a's groups plus its peers'", f"{url}/apis", accept=DISCOVERY_ACCEPT),
        Probe(
            "local-only discovery (profile=nopeer): a's groups alone",
            f"{url}/apis",
            accept=f"{DISCOVERY_ACCEPT};profile=nopeer",
        ),
        # Anchored: Envoy's own envoy_wasm_kube_peer_proxy_* VM stats exist even
        # when the filter has defined no metric of its own.
        Probe("filter metrics", f"http://127.0.0.1:{a.admin_port}/stats/prometheus", grep="^kube_peer_proxy_"),
    ]


def kubectl_commands() -> list[str]:
    kubectl = f"{_rel(KUBECTL)} --kubeconfig {_rel(DEMO_DIR / 'kubeconfig')}"
    return [
        f"{kubectl} api-resources --api-group=resource.k8s.io",
        # The fake apiservers serve no /openapi, so kubectl cannot validate client-side.
        f"{kubectl} create --validate=false -f {_rel(DEMO_DIR / 'resourceclaim.yaml')}",
        f"{kubectl} get resourceclaims.v1.resource.k8s.io",
        f"{kubectl} get resourceclaims.v1.resource.k8s.io --watch --request-timeout=10s",
    ]


def _rel(path: Path) -> str:
    return os.path.relpath(path)


def start_envoy(node: Node, nodes: list[Node], wasm: Path) -> harness.Envoy:
    config = render.render_bootstrap(
        node=node.name,
        listen_port=node.listen_port,
        admin_port=node.admin_port,
        local=("127.0.0.1", node.apiserver_port),
        peers=[(p.name, "127.0.0.1", p.apiserver_port) for p in nodes if p is not node],
        wasm_path=str(wasm),
        plugin=None,
    )
    workdir = DEMO_DIR / f"envoy-{node.name}"
    shutil.rmtree(workdir, ignore_errors=True)  # fresh log per run
    return harness.Envoy(config, f"envoy-{node.name}", node.admin_port, workdir=workdir).start(wait_ready=False)


def wait_for_merged_discovery(a: Node) -> None:
    probe = Probe(
        "discovery", f"http://127.0.0.1:{a.listen_port}/apis", accept=DISCOVERY_ACCEPT, grep=re.escape(NEW_ONLY_GROUP)
    )
    last = ""

    def ready() -> bool:
        nonlocal last
        ok, last = probe.run()
        return ok

    try:
        harness.wait_until(ready, READY_TIMEOUT, interval=0.2)
    except AssertionError:
        raise RuntimeError(
            f"Envoy A's merged discovery did not list {NEW_ONLY_GROUP} within {READY_TIMEOUT:.0f}s (last: {last})"
        ) from None


def write_files(a: Node) -> None:
    (DEMO_DIR / "kubeconfig").write_text(
        f"""\
apiVersion: v1
kind: Config
clusters:
- name: kpp-envoy-a
  cluster:
    server: http://127.0.0.1:{a.listen_port}
users:
- name: anonymous
  user: {{}}
contexts:
- name: kpp-envoy-a
  context:
    cluster: kpp-envoy-a
    user: anonymous
    namespace: default
current-context: kpp-envoy-a
"""
    )
    (DEMO_DIR / "resourceclaim.yaml").write_text(RESOURCECLAIM_YAML)


def print_guide(nodes: list[Node], envoys: list[harness.Envoy], probes: list[Probe], check: bool) -> None:
    print("\nkube-peer-proxy demo is up:")
    for node, envoy in zip(nodes, envoys, strict=True):
        print(
            f"  apiserver {node.name} ({node.apiset}) :{node.apiserver_port}  <-  Envoy {node.name.upper()} "
            f":{node.listen_port} (admin :{node.admin_port}, log {_rel(envoy.log_path)})"
        )
    print("\nWhat to try (through Envoy A, which fronts the old apiserver):")
    for probe in probes:
        print(f"  # {probe.what}\n  {probe.curl()}")
    print(f"\n  # kubectl v1.36.3 through Envoy A (kubeconfig {_rel(DEMO_DIR / 'kubeconfig')})")
    for cmd in kubectl_commands():
        print(f"  {cmd}")
    print("\n  # what each node's filter sees, refreshed in place (docs/deploy.md \"What to watch\")")
    print("  .venv/bin/kube-peer-proxy-status --watch "
          + " ".join(f"{n.name}=127.0.0.1:{n.admin_port}" for n in nodes))
    if not check:
        print("\nCtrl-C stops everything.", flush=True)


def run_checks(probes: list[Probe]) -> int:
    print("\nRunning the curl commands:")
    failed = 0
    for probe in probes:
        ok, detail = probe.run()
        failed += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {probe.what}: {detail}")
    print(f"check: {len(probes) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def wait_for_signal(envoys: list[harness.Envoy]) -> int:
    """Block until Ctrl-C/SIGTERM (Interrupted); an Envoy that dies ends the demo."""
    while True:
        for envoy in envoys:
            if envoy.process.poll() is not None:
                print(f"demo: {envoy.name} exited with code {envoy.process.returncode}; its log:", file=sys.stderr)
                print(envoy.log_tail(100), file=sys.stderr)
                return 1
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="run the curl commands, assert 200 for each, then stop")
    args = parser.parse_args(argv)

    nodes = make_nodes(int(os.environ.get("KPP_DEMO_BASE", "0")))
    a = nodes[0]
    probes = make_probes(a)

    def interrupt(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)

    cluster = Cluster()
    envoys: list[harness.Envoy] = []
    try:
        wasm = harness.wasm_path()
        DEMO_DIR.mkdir(exist_ok=True)
        for node in nodes:
            cluster.start(node.name, port=node.apiserver_port, apiset=node.apiset)
        # Launched together and then awaited: each Envoy spends seconds compiling the wasm.
        for node in nodes:
            envoys.append(start_envoy(node, nodes, wasm))
        for envoy in envoys:
            envoy.wait_until_ready(READY_TIMEOUT)
            # Before its first discovery round a filter sends everything to its local server (and
            # answers 503 where a 404 might be false): wait until each has learned its peers.
            envoy.wait_snapshot(READY_TIMEOUT)
        wait_for_merged_discovery(a)
        write_files(a)
        print_guide(nodes, envoys, probes, args.check)
        return run_checks(probes) if args.check else wait_for_signal(envoys)
    except Interrupted as e:
        print(f"\ndemo: {e}, stopping", flush=True)
        return 1 if args.check else 0
    except (RuntimeError, AssertionError) as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C must not cut the cleanup short and orphan processes.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for envoy in envoys:
            envoy.stop()
        cluster.stop_all()


if __name__ == "__main__":
    sys.exit(main())
