"""What false 404s do to real controllers during a real kube-apiserver upgrade (`make upgrade-k8s`).

Real binaries: etcd v3.6.8, three kubeadm control-plane "nodes" (kpp.testing.kubeadm_node: kubeadm
v1.36.3 PKI, kubeconfigs and apiserver flags, node IP 127.0.0.1<i>, Envoy on <node-ip>:6443, the
apiserver on 127.0.1.1<i>:6443) starting at kube-apiserver v1.35.4, and kube-controller-manager
v1.36.3 running only the garbage collector and the namespace controller.

Two runs on the same schedule:

* control: each node's Envoy is a plain TLS passthrough (tcp_proxy) to its apiserver -- a cluster
  without kube-peer-proxy; client certificates reach the apiserver end to end;
* filter: each node's Envoy is kpp.render's `render_kubeadm` (the kube-peer-proxy filter).

In-cluster clients reach the apiservers as through the `kubernetes` Service: an Envoy tcp_proxy on
127.0.0.10:6443, round robin over the three nodes' 6443 listeners (TLS passthrough). Every apiserver
runs with `--goaway-chance=0.02`, the documented setting for HTTP/2 clients behind such a load balancer
(without it client-go keeps one HTTP/2 connection, i.e. one apiserver, until that server restarts).

Schedule (phase "lb": the controller-manager's kubeconfig names the load balancer; phase "node": it
names its node's own endpoint, cp-1's <node-ip>:6443, i.e. kubeadm's controller-manager.conf):

  lb:   start kcm; upgrade cp-1, cp-2, cp-3 to v1.36.3 one at a time (stop, start, /readyz); a workload
        creates owners (MutatingAdmissionPolicy, admissionregistration.k8s.io/v1: only v1.36 serves it)
        and, right after each, dependents (ConfigMaps with an ownerReference to the owner's uid) all along;
        a namespace with dependents is created and deleted.
  node: stop that kcm, start one on cp-1's own endpoint, let it discover the new types, roll cp-1 back
        to v1.35.4 8 s after one of the GC's 30 s discovery syncs, i.e. while its REST mapper still
        maps the new types; same workload, same namespace test.

Every third round the workload also makes real garbage (a dependent of an owner deleted before the
dependent was created), which the GC must delete in both runs. docs/upgrade-k8s.md explains, with
references into the GC's code, why the control loses dependents in the node phase and not in the
load-balancer phase.

Evidence: the apiservers' audit logs (per node, Metadata level), the Envoys' access logs, the
controller-manager's log, the workload's own responses, and the end state (which dependents are gone
although their owner exists).

    .venv/bin/python -m kpp.testing.sim.upgrade_k8s [--runs control,filter] [--short] [--plot docs/upgrade-k8s.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

from kpp.testing import harness, mutants
from kpp.testing.cluster import CACHE, Proc
from kpp.testing.proc import OPENER, free_port, wait_for
from kpp.render import DISCOVERY_USER
from kpp.testing.kubeadm_node import (APISERVER_PORT, SNI, KubeadmCluster, KubeadmNode, kubeconfig_credentials, request,
                              write_kubeconfig)

OLD, NEW = "v1.35.4", "v1.36.3"
KUBEADM_VERSION = NEW
KCM_VERSION = NEW
LB_IP = "127.0.0.10"  # with the nodes at index 1.. (127.0.0.11..); Run(first_index=) moves both
NODES = ["cp-1", "cp-2", "cp-3"]
KCM_NODE = "cp-1"
V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
NOPEER = V2 + ";profile=nopeer"
OWNER_GVR = ("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies")
KCM_USER = "system:kube-controller-manager"
MODES = ("control", "filter") + tuple(f"mutant-{k}" for k in mutants.KINDS)
# Pass rules of a filter run (filter_rules()). Measured in the runs of docs/upgrade-k8s.md: client-visible
# 503s 6 of 962 (full run) and 8 of 386 (short run) of the requests through the client listeners,
# rerouted requests failed 0, workload requests failed 6 of 469 and 1 of 183.
MAX_503_SHARE = 0.03          # client-visible 503s / requests through the nodes' client listeners
MAX_503_FLOOR = 30            # ... or this many, whichever is larger (short runs have few requests)
MAX_REROUTE_FAILED_SHARE = 0.03  # rerouted requests answered 5xx or not at all / rerouted requests
MAX_REROUTE_FAILED_FLOOR = 2
MAX_WORKLOAD_FAILED_SHARE = 0.05  # workload requests answered neither 2xx nor the expected 404
ROLLBACK_AFTER_SYNC = 8.0   # s after a GC discovery sync: cp-1 is back (as v1.35.4) ~8 s later
WORKLOAD_JOIN_TIMEOUT = 180.0  # a workload round: a few requests, each up to 12 tries of at most 10 s
DRAIN_TIMEOUT = 60.0        # clients stopped: every stream through the nodes' Envoys ends within this


class Node(KubeadmNode):
    """A kubeadm node whose kubeadm is v1.36.3 whatever version its apiserver runs (kubeadm v1.36
    supports a v1.35 control plane: `kubernetesVersion: v1.35.4` in its ClusterConfiguration)."""

    def kubeadm(self, *args):
        import subprocess
        exe = CACHE / "k8s" / KUBEADM_VERSION / "kubeadm"
        r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"kubeadm {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r.stdout + r.stderr


def tcp_bootstrap(name: str, listen: tuple[str, int], upstreams: list[tuple[str, int]], admin_port: int,
                  access_log: Path) -> str:
    """An Envoy that only passes TCP (TLS included) through, round robin over upstreams."""
    return json.dumps({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{"name": name, "address": {"socket_address": {"address": listen[0],
                                                                         "port_value": listen[1]}},
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                               "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                               "stat_prefix": name, "cluster": "upstreams", "max_connect_attempts": 3,
                               "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                                   "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                                   "path": str(access_log),
                                   "log_format": {"json_format": {
                                       "start": "%START_TIME%", "upstream_host": "%UPSTREAM_HOST%",
                                       "client": "%DOWNSTREAM_REMOTE_ADDRESS%", "flags": "%RESPONSE_FLAGS%",
                                       "duration_ms": "%DURATION%"}}}}]}}]}]}],
            "clusters": [{"name": "upstreams", "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
                          "load_assignment": {"cluster_name": "upstreams", "endpoints": [{"lb_endpoints": [
                              {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}}
                              for h, p in upstreams]}]}}]}})


def ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


class Run:
    def __init__(self, mode: str, workdir: Path, short: bool, first_index: int = 1):
        assert mode in MODES, mode
        self.lb_ip = f"127.0.0.{9 + first_index}"
        self.mode, self.short = mode, short
        # every mode but the control runs the filter (a mutant: with one deliberate break, kpp.testing.mutants)
        self.filtered = mode != "control"
        self.mutant = mode.removeprefix("mutant-") if mode.startswith("mutant-") else None
        self.workdir = workdir
        self.kc = KubeadmCluster(workdir, [(n, "") for n in NODES], version=OLD, first_index=first_index)
        for n in self.kc.nodes.values():
            n.__class__ = Node
            n.extra_flags["--goaway-chance"] = "0.02"
        self.t0 = time.time()
        self.events: list[tuple[float, str]] = []
        self.versions: dict[str, list[tuple[float, float | None, str]]] = {n: [] for n in NODES}  # in service
        self.envoys: list = []
        self.lb = None
        self.kcm: Proc | None = None
        self.kcm_logs: list[Path] = []
        self.client_log: list[dict] = []      # every workload response
        self.dependents: list[dict] = []      # {ns, name, owner, owner_uid, phase}
        self.owners: list[dict] = []
        self.workload_errors: list[str] = []
        self.garbage: list[dict] = []         # dependents whose owner was deleted before they were created
        self.namespaces: list[dict] = []
        self.stop_workload = threading.Event()
        self.workload_thread: threading.Thread | None = None
        self.phase = "setup"
        self.timings: dict[str, float] = {}
        self.only_new: list[tuple[str, str, str]] = []
        self.rerouted = 0
        self.rerouted_codes_metric: dict[str, int] = {}
        self.cut: dict = {}  # what collect() saw at its cut (see drain())

    # ---- helpers ----
    def event(self, what: str):
        t = time.time()
        self.events.append((t, what))
        print(f"[{self.mode} +{t - self.t0:6.1f}s] {what}", flush=True)

    def node(self, name) -> Node:
        return self.kc.node(name)

    def version_at(self, name: str, t: float) -> str | None:
        for start, end, v in self.versions[name]:
            if start - 1.0 <= t and (end is None or t <= end + 1.0):
                return v
        return None

    def new_in_service(self, t: float) -> bool:
        return any(s <= t and (e is None or t <= e) and v == NEW for n in NODES for s, e, v in self.versions[n])

    def creds(self, which: str):
        return kubeconfig_credentials(self.node("cp-1").kubeconfig(which), self.workdir / "creds")

    def lb_req(self, path, **kw):
        crt, key = self.admin
        return request(self.lb_ip, APISERVER_PORT, path, ca=self.node("cp-1").pki / "ca.crt", sni=SNI, cert=crt,
                       key=key, timeout=10, **kw)

    # ---- processes ----
    def start(self):
        t = time.monotonic()
        first = None
        for n in self.kc.nodes.values():
            n.prepare(first)
            first = first or n
        self.kc.etcd.start()
        for n in self.kc.nodes.values():
            n.start_apiserver()
        for n in self.kc.nodes.values():
            n.wait_apiserver(300)
            self.versions[n.name].append((time.time(), None, n.version))
        self.kc.apply_rbac()
        # --use-service-account-credentials=false: the controller-manager's own identity does the
        # controllers' work, so it gets their bootstrap roles (kubeadm's clusters use per-controller
        # service accounts bound to exactly these roles).
        self.kc.apply([{
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"kpp-kcm-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": f"system:controller:{role}"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KCM_USER}]}
            for role in ("generic-garbage-collector", "namespace-controller")])
        self.admin = self.creds("admin")
        nodes = list(self.kc.nodes.values())
        for n in nodes:
            n.admin_port = free_port()
            if self.filtered:
                n.start_envoy([p for p in nodes if p is not n], self.kc.wasm,
                              mutate=(lambda t: mutants.mutate(t, self.mutant)) if self.mutant else None)
            else:
                n.envoy_yaml = tcp_bootstrap(f"node-{n.name}", (n.node_ip, APISERVER_PORT),
                                             [(n.apiserver_ip, APISERVER_PORT)], n.admin_port, n.access_log)
                n.envoy = harness.Envoy(n.envoy_yaml, f"passthrough-{n.name}", n.admin_port,
                                        workdir=n.workdir / "envoy", log_level="warn", component_log_level="misc:warn")
                n.envoy.start(wait_ready=False)
        lb_admin = free_port()
        self.lb = harness.Envoy(tcp_bootstrap("kubernetes-service", (self.lb_ip, APISERVER_PORT),
                                              [(n.node_ip, APISERVER_PORT) for n in nodes], lb_admin,
                                              self.workdir / "lb-access.log"),
                                "lb", lb_admin, workdir=self.workdir / "lb", log_level="warn",
                                component_log_level="misc:warn")
        self.lb.start(wait_ready=False)
        for n in nodes:
            n.envoy.wait_until_ready(60)
            if self.filtered:
                n.envoy.wait_snapshot(60)
        self.lb.wait_until_ready(60)
        wait_for(lambda: self.lb_req("/readyz").status == 200, 30, "readyz through the load balancer")
        self.timings["startup"] = round(time.monotonic() - t, 1)
        self.event(f"3 apiservers {OLD} + Envoys ({self.mode}) + load balancer ready")

    def restart_apiserver(self, name: str, version: str):
        n = self.node(name)
        self.event(f"{name}: stop {n.version}")
        # kube-apiserver v1.36.3 does not always exit within seconds of SIGTERM while watches are open
        # (graceful termination); after 5 s it is killed, as a kubelet would after its grace period.
        n.apiserver_proc.stop(timeout=5)
        s, _, v = self.versions[name][-1]
        self.versions[name][-1] = (s, time.time(), v)
        n.version = version
        n.start_apiserver()
        n.wait_apiserver(300)
        self.versions[name].append((time.time(), None, version))
        self.event(f"{name}: {version} ready")

    def start_kcm(self, how: str):
        if how == "lb":
            crt, key = self.creds("controller-manager")
            kc = write_kubeconfig(self.workdir / "kcm-lb.json", f"https://{self.lb_ip}:{APISERVER_PORT}",
                                  self.node("cp-1").pki / "ca.crt", cert=crt, key=key, tls_server_name=SNI)
        else:
            kc = self.node(KCM_NODE).node_kubeconfig("controller-manager")
        assert "192.0.2." not in kc.read_text()
        exe = CACHE / "k8s" / KCM_VERSION / "kube-controller-manager"
        log = self.workdir / f"kube-controller-manager-{how}.log"
        self.kcm_logs.append(log)
        self.kcm = Proc(f"kcm-{how}", [
            str(exe), f"--kubeconfig={kc}", "--controllers=garbagecollector,namespace",
            "--use-service-account-credentials=false", "--leader-elect=false", "--secure-port=0",
            "--concurrent-gc-syncs=5", "--concurrent-namespace-syncs=2", "--namespace-sync-period=10s",
            # every discovery sync of the garbage collector (30 s, hard-coded) and its item decisions
            "--v=2", "--vmodule=garbagecollector=5"], log).start()
        self.event(f"kube-controller-manager {KCM_VERSION} started ({'load balancer' if how == 'lb' else KCM_NODE + ' own endpoint'})")

    def gc_syncs(self) -> list[float]:
        """Times of the garbage collector's discovery syncs (kcm log, --vmodule=garbagecollector=5)."""
        out = []
        day = datetime.now().strftime("%Y-%m-%d")
        for line in self.kcm_logs[-1].read_text(errors="replace").splitlines():
            if ("skipping garbage collector sync" in line or "syncing garbage collector with updated" in line) \
                    and line[:1] in "IEW":
                out.append(datetime.fromisoformat(f"{day}T{line[6:21]}").timestamp())
        return out

    def wait_gc_sync(self, timeout: float = 45.0):
        n0 = len(self.gc_syncs())
        wait_for(lambda: len(self.gc_syncs()) > n0, timeout, "the garbage collector's next discovery sync",
                 interval=0.2)
        self.event("garbage collector discovery sync (kcm log)")

    def stop_kcm(self):
        if self.kcm:
            self.kcm.stop()
            self.kcm = None
            self.event("kube-controller-manager stopped")

    def stop(self):
        self.stop_workload.set()
        if self.kcm:
            self.kcm.stop()
        if self.lb:
            self.lb.stop()
        self.kc.stop()

    # ---- workload ----
    def create_owner(self, tag: str) -> dict | None:
        name = f"kpp-owner-{tag}"
        body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {"failurePolicy": "Ignore", "reinvocationPolicy": "Never",
                         "matchConstraints": {"resourceRules": [{
                             "apiGroups": ["kpp.example.com"], "apiVersions": ["v1"], "operations": ["CREATE"],
                             "resources": ["widgets"]}]},
                         "mutations": [{"patchType": "JSONPatch", "jsonPatch": {
                             "expression": '[JSONPatch{op: "add", path: "/metadata/annotations/kpp", value: "x"}]'}}]}}
        for _ in range(12):
            r = self.record("create owner", "POST", "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
                            body)
            if r is not None and r.status == 201:
                o = r.json()
                owner = {"name": name, "uid": o["metadata"]["uid"], "phase": self.phase}
                self.owners.append(owner)
                return owner
            if r is not None and r.status in (400, 409, 422):
                raise RuntimeError(f"creating {name}: {r!r}")
            # else retry: 404 (a server without the type), 401/403 (a server that accepts requests before
            # its authorizer has synced, i.e. before /readyz), 429, 5xx, connection errors
            time.sleep(0.2)
        return None

    def create_dependent(self, ns: str, owner: dict, i: int):
        name = f"{owner['name']}-dep-{i}"
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "ownerReferences": [{
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
            "name": owner["name"], "uid": owner["uid"]}]}, "data": {"owner": owner["name"]}}
        for _ in range(12):
            r = self.record("create dependent", "POST", f"/api/v1/namespaces/{ns}/configmaps", body)
            if r is not None and r.status == 201:
                self.dependents.append({"ns": ns, "name": name, "owner": owner["name"], "owner_uid": owner["uid"],
                                        "phase": self.phase, "t": time.time()})
                return
            time.sleep(0.2)

    def create_garbage(self, ns: str, tag: str):
        """A dependent of an owner that is already deleted: real garbage, which the GC must delete.
        Its owner is unknown to the GC's graph, so the GC looks it up with a live GET (and thereby fills
        its REST mapper from discovery: without such a lookup the mapper may still be empty when the
        discovery changes)."""
        owner = self.create_owner(tag)
        if not owner:
            return
        self.owners.remove(owner)
        for _ in range(12):
            r = self.record("delete owner", "DELETE",
                            f"/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/{owner['name']}")
            if r is not None and r.status in (200, 202):
                break
            time.sleep(0.2)
        else:
            return
        name = f"{owner['name']}-garbage"
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "ownerReferences": [{
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
            "name": owner["name"], "uid": owner["uid"]}]}}
        for _ in range(12):
            r = self.record("create garbage", "POST", f"/api/v1/namespaces/{ns}/configmaps", body)
            if r is not None and r.status == 201:
                self.garbage.append({"ns": ns, "name": name, "phase": self.phase})
                return
            time.sleep(0.2)

    def record(self, what, method, path, body=None):
        t = time.time()
        try:
            r = self.lb_req(path, method=method, body=body)
            status = r.status
        except OSError as e:
            r, status = None, f"{type(e).__name__}"
        self.client_log.append({"t": t, "what": what, "method": method, "path": path, "status": status,
                                "phase": self.phase})
        return r

    def workload(self, ns: str = "default", deps: int = 2, period: float = 1.5):
        i = 0
        while not self.stop_workload.is_set():
            i += 1
            try:
                owner = self.create_owner(f"{self.mode}-{self.phase}-{i}-{uuid.uuid4().hex[:4]}")
                if owner:
                    for j in range(deps):
                        self.create_dependent(ns, owner, j)
                if i % 3 == 1:
                    self.create_garbage(ns, f"{self.mode}-{self.phase}-g{i}-{uuid.uuid4().hex[:4]}")
            except Exception as e:  # noqa: BLE001 -- keep the workload going, but say so
                self.workload_errors.append(repr(e))
                print(f"[{self.mode}] workload error: {e!r}", flush=True)
            self.stop_workload.wait(period)

    def start_workload(self):
        self.stop_workload.clear()
        th = threading.Thread(target=self.workload, daemon=True)
        th.start()
        self.workload_thread = th
        return th

    def join_workload(self):
        self.stop_workload.set()
        if self.workload_thread is not None:
            self.workload_thread.join(WORKLOAD_JOIN_TIMEOUT)
            if self.workload_thread.is_alive():
                raise RuntimeError(f"{self.mode}: the workload did not stop within {WORKLOAD_JOIN_TIMEOUT:.0f} s")
            self.workload_thread = None

    def namespace_test(self, label: str, deps: int = 3, timeout: float = 90.0):
        ns = f"kpp-ns-{label}-{uuid.uuid4().hex[:5]}"
        r = self.record("create namespace", "POST", "/api/v1/namespaces",
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        assert r is not None and r.status == 201, r
        for k in range(deps):
            owner = self.create_owner(f"{self.mode}-{label}-ns-{k}-{uuid.uuid4().hex[:4]}")
            if owner:
                self.create_dependent(ns, owner, 0)
        entry = {"ns": ns, "phase": label, "seconds": None}
        self.namespaces.append(entry)

        def delete_and_wait():
            t = time.time()
            self.event(f"delete namespace {ns}")
            self.record("delete namespace", "DELETE", f"/api/v1/namespaces/{ns}")
            while time.time() - t < timeout:
                r = self.record("get namespace", "GET", f"/api/v1/namespaces/{ns}")
                if r is not None and r.status == 404:
                    entry["seconds"] = round(time.time() - t, 1)
                    self.event(f"namespace {ns} gone after {entry['seconds']}s")
                    return
                time.sleep(1)
            self.event(f"namespace {ns} still there after {timeout:.0f}s: stuck")
        return delete_and_wait

    # ---- schedule ----
    def only_new_gvrs(self):
        def gvrs(n):
            out = set()
            for root in ("/api", "/apis"):
                r = n.direct(root, headers={"Accept": NOPEER})
                assert r.status == 200, r
                for g in r.json()["items"]:
                    for v in g["versions"]:
                        for res in v.get("resources") or []:
                            out.add((g["metadata"].get("name", ""), v["version"], res["resource"]))
            return out
        new = [n for n in self.kc.nodes.values() if n.version == NEW]
        old = [n for n in self.kc.nodes.values() if n.version == OLD]
        self.only_new = sorted(gvrs(new[0]) - gvrs(old[0]))
        self.event(f"only {NEW} serves: {', '.join('/'.join(g) for g in self.only_new)}")
        assert OWNER_GVR in self.only_new, self.only_new

    def schedule(self):
        settle = 20 if self.short else 35
        if not self.short:
            # phase lb: the upgrade, controller-manager behind the load balancer
            self.phase = "lb"
            self.start_kcm("lb")
            time.sleep(10)
            self.restart_apiserver("cp-1", NEW)
            self.only_new_gvrs()
            self.start_workload()
            time.sleep(settle)
            ns_done = self.namespace_test("lb")
            self.restart_apiserver("cp-2", NEW)
            time.sleep(settle)
            ns_done()
            self.restart_apiserver("cp-3", NEW)
            time.sleep(10)
            self.join_workload()
            self.stop_kcm()
        else:
            # short: the upgrade without a controller-manager, then the node-local rollback
            for name in NODES:
                self.restart_apiserver(name, NEW)
                if name == "cp-1":
                    self.only_new_gvrs()
        # phase node: controller-manager on cp-1's own endpoint, cp-1 rolled back
        self.phase = "node"
        self.start_kcm("node")
        self.start_workload()
        # its discovery (and the GC's 30 s discovery sync) now lists the v1.36 types
        time.sleep(15)
        ns_done = self.namespace_test("node")
        # The controller-manager's REST mapper (a DeferredDiscoveryRESTMapper over a memory-cached
        # discovery client) is reset every 30 s (controllermanager.go) just before the GC's own discovery
        # sync (garbagecollector.go Sync, also 30 s), and refilled by the next lookup. Roll cp-1 back in
        # the middle of such a period, after a lookup (a garbage dependent: its owner is unknown to the
        # GC) has refilled it from the v1.36 cp-1, so that the mapper still maps MutatingAdmissionPolicy
        # for the ~10 s between cp-1 answering as v1.35.4 and the next reset.
        self.wait_gc_sync()
        t_sync = time.time()
        self.create_garbage("default", f"{self.mode}-warm-{uuid.uuid4().hex[:4]}")
        time.sleep(max(0.0, t_sync + ROLLBACK_AFTER_SYNC - time.time()))
        self.restart_apiserver(KCM_NODE, OLD)
        ns_done()
        time.sleep(settle)
        self.stop_workload.set()
        time.sleep(8)  # let the GC finish what it queued

    def envoy_stat(self, n, name: str) -> int:
        return n.envoy.stats(f"^{name.replace('.', '[.]')}$").get(name, 0)

    def drain(self):
        """The cut at which the rerouted counter is compared with the access logs. The filter counts a
        rerouted request at its response headers; Envoy writes its access-log line when the stream ends.
        So the clients stop first (the workload, then kube-controller-manager, whose informers hold
        rerouted watches open), then every stream through the nodes' client listeners must have ended
        (`downstream_rq_active` 0), and only then are the counters read: from here on nothing is rerouted
        (what still arrives is the apiservers' own traffic, marked x-kubernetes-peer-proxied, which stays
        local). Earlier runs read the counter while those watches were open and stopped Envoy under them:
        those requests were counted but never got a line."""
        self.join_workload()
        self.stop_kcm()
        if not self.filtered:
            return
        nodes = list(self.kc.nodes.values())

        def active() -> dict[str, int]:
            return {n.name: self.envoy_stat(n, "http.apiserver.downstream_rq_active") for n in nodes}
        try:
            wait_for(lambda: not any(active().values()), DRAIN_TIMEOUT, "the nodes' client streams to end",
                     interval=0.1)
        except TimeoutError:
            pass  # reported: the same-cut rule below fails with the streams still open
        self.cut["open_streams"] = active()
        self.rerouted, self.rerouted_codes_metric = 0, {}
        for n in nodes:
            for k, v in n.envoy.stats("rerouted_request_total").items():
                self.rerouted += v
                code = dict(p.split("=", 1) for p in k.split(";")[1:] if "=" in p).get("code", "?")
                self.rerouted_codes_metric[code] = self.rerouted_codes_metric.get(code, 0) + v

    def flush_access_logs(self):
        """Envoy writes its access log from a buffer (every 10 s); a stop through func-e (the harness's
        launcher) ends Envoy before it writes that buffer (measured: 1 of 20 lines written; the
        earlier runs' comment that stopping flushes them was wrong). Admin /reopen_logs makes it write
        now: wait until each node's log has a line for every request its listeners finished."""
        before = {n.name: len(n.access_entries()) for n in self.kc.nodes.values()}
        for n in self.kc.nodes.values():
            req = urllib.request.Request(f"{n.envoy.admin_url}/reopen_logs", method="POST")
            with OPENER.open(req, timeout=10) as r:
                if r.status != 200:
                    raise RuntimeError(f"{n.name}: /reopen_logs answered {r.status}")
        for n in self.kc.nodes.values():
            if self.filtered:
                ends = [f"http.{p}.downstream_rq_{k}" for p in ("apiserver", "peers") for k in ("total", "active")]
            else:
                ends = [f"tcp.node-{n.name}.downstream_cx_{k}" for k in ("total", "active")]
            vals = [self.envoy_stat(n, e) for e in ends]
            finished = sum(vals[0::2]) - sum(vals[1::2])
            try:
                wait_for(lambda: len(n.access_entries()) >= finished, 30,
                         f"{n.name}: {finished} access-log lines after /reopen_logs", interval=0.2)
            except TimeoutError:  # reported with the results, and the rules that read the log judge it
                self.cut.setdefault("access_log_lines_missing", {})[n.name] = finished - len(n.access_entries())
            # what a stop without /reopen_logs would have lost
            self.cut.setdefault("access_log_lines_buffered", {})[n.name] = len(n.access_entries()) - before[n.name]

    # ---- evidence ----
    def collect(self) -> dict:
        self.drain()
        self.flush_access_logs()
        for n in self.kc.nodes.values():
            n.envoy.stop()
        # the end state, read straight from a v1.36 apiserver (cp-2)
        ref = self.node("cp-2")
        assert ref.version == NEW
        existing_owners = set()
        r = ref.direct("/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies")
        assert r.status == 200, r
        for o in r.json()["items"]:
            existing_owners.add(o["metadata"]["uid"])
        gone_ns = {e["ns"] for e in self.namespaces}
        lost = []
        for d in self.dependents:
            if d["ns"] in gone_ns or d["owner_uid"] not in existing_owners:
                continue
            r = ref.direct(f"/api/v1/namespaces/{d['ns']}/configmaps/{d['name']}")
            if r.status == 404:
                lost.append(d)
        collected = sum(1 for g in self.garbage
                        if ref.direct(f"/api/v1/namespaces/{g['ns']}/configmaps/{g['name']}").status == 404)
        # audit logs: every response any apiserver gave
        audit = []
        for n in self.kc.nodes.values():
            for e in n.audit_events():
                if e.get("stage") not in ("ResponseComplete", "Panic"):
                    continue
                o = e.get("objectRef") or {}
                t = ts(e["stageTimestamp"])
                audit.append({"t": t, "node": n.name, "version": self.version_at(n.name, t),
                              "audit_id": e.get("auditID"),
                              "code": (e.get("responseStatus") or {}).get("code"), "verb": e.get("verb"),
                              "user": (e.get("user") or {}).get("username"), "uri": e.get("requestURI"),
                              "gvr": (o.get("apiGroup", ""), o.get("apiVersion", ""), o.get("resource", "")),
                              "name": o.get("name"), "namespace": o.get("namespace")})
        only_new = set(self.only_new)
        for a in audit:
            a["false404"] = (a["code"] == 404 and a["gvr"] in only_new and a["version"] == OLD
                             and self.new_in_service(a["t"]))
        gc_deletes = [a for a in audit if a["verb"] == "delete" and a["gvr"][2] == "configmaps"
                      and a["user"] == KCM_USER and a["code"] in (200, 202)
                      and a["namespace"] not in gone_ns]
        access = []
        for n in self.kc.nodes.values():
            for e in n.access_entries():
                access.append({"node": n.name, **e})
        # the nodes' client listeners (6443): what clients (workload, kcm) saw from the proxy
        client_side = [e for e in access if str(e.get("listener_port")) == str(APISERVER_PORT)]
        rerouted = [e for e in client_side if e.get("cluster") not in (None, "-", "local", "local-anon")]
        # The counter's definition: counted when the answer's headers pass the filter. A stream that ended
        # before any answer (code 0: the client went away) has a line but was never counted.
        rerouted_log = sum(1 for e in rerouted if str(e.get("code")) != "0")
        rerouted_codes: dict[str, int] = {}
        for e in rerouted:
            rerouted_codes[str(e.get("code"))] = rerouted_codes.get(str(e.get("code")), 0) + 1
        # With the filter, an apiserver's 404 may never reach the client: the filter answers 503 instead
        # when the local server says 404 for a GVR a peer serves (README, "HTTP filter"). Each audit event
        # is matched to the one access-log line of the same node that carries its audit ID (the
        # apiserver's Audit-Id response header); what that line answered is what the client saw.
        audit404_unmatched = []
        if self.filtered:
            by_audit_id: dict[tuple[str, str], list[dict]] = {}
            for e in access:
                if e.get("resp_audit_id") not in (None, "-", ""):
                    by_audit_id.setdefault((e["node"], e["resp_audit_id"]), []).append(e)
            for a in audit:
                if a["code"] != 404 or a["user"] in ("kubernetes-super-admin", DISCOVERY_USER):
                    continue  # the end-state reads go straight to cp-2; the proxy's own calls have no listener
                lines = by_audit_id.get((a["node"], a["audit_id"]), [])
                if len(lines) != 1:
                    audit404_unmatched.append({**a, "lines": len(lines)})
                    continue
                code = lines[0].get("code")
                if a["false404"] and str(code) != "404":
                    a["false404"], a["intercepted"] = False, code
        intercepted = sum(1 for a in audit if a.get("intercepted"))
        false404 = {}
        for a in audit:
            if a["false404"]:
                key = "/".join(a["gvr"])
                false404.setdefault(key, {"kcm": 0, "clients": 0})
                false404[key]["kcm" if a["user"] == KCM_USER else "clients"] += 1
        client_503 = sum(1 for e in client_side if str(e.get("code")) == "503")
        workload_failed = [c for c in self.client_log
                           if not (isinstance(c["status"], int) and 200 <= c["status"] < 300)
                           and not (c["status"] == 404 and c["what"] == "get namespace")]
        return {
            "mode": self.mode, "short": self.short, "timings": self.timings,
            "client_listener_requests": len(client_side), "client_listener_503": client_503,
            "rerouted_codes": rerouted_codes, "audit404_unmatched": len(audit404_unmatched),
            "audit404_unmatched_examples": [{k: a[k] for k in ("node", "uri", "user", "lines")}
                                            for a in audit404_unmatched[:5]],
            "workload_failed": len(workload_failed),
            "workload_failed_examples": [f"{c['what']} {c['method']} {c['path']}: {c['status']}"
                                         for c in workload_failed[:5]],
            "owners_by_phase": {p: sum(1 for o in self.owners if o["phase"] == p) for p in ("lb", "node")},
            "owners": len(self.owners), "dependents": len(self.dependents), "lost": lost,
            "lost_by_phase": {p: sum(1 for d in lost if d["phase"] == p) for p in ("lb", "node")},
            "dependents_by_phase": {p: sum(1 for d in self.dependents if d["phase"] == p) for p in ("lb", "node")},
            "workload_errors": self.workload_errors,
            "garbage": len(self.garbage), "garbage_collected": collected,
            "gc_deletes_live_owner": sum(1 for a in gc_deletes if any(
                d["name"] == a["name"] and d["owner_uid"] in existing_owners for d in self.dependents)),
            "false404": false404,
            "false404_total": sum(a["false404"] for a in audit),
            "intercepted_404": intercepted,
            "audit_503": sum(1 for a in audit if a["code"] == 503),
            "envoy_503": sum(1 for e in access if str(e.get("code")) == "503"),
            "client_503": sum(1 for c in self.client_log if c["status"] == 503),
            # (the namespace test's final GET of a deleted namespace is a true 404: not counted)
            "client_404": sum(1 for c in self.client_log if c["status"] == 404 and c["what"] != "get namespace"),
            "client_requests": len(self.client_log),
            "namespaces": self.namespaces,
            "rerouted_metric": self.rerouted, "rerouted_access_log": rerouted_log,
            "rerouted_unanswered": len(rerouted) - rerouted_log, "rerouted_codes_metric": self.rerouted_codes_metric,
            "open_streams_at_cut": self.cut.get("open_streams", {}),
            "access_log_lines_missing": self.cut.get("access_log_lines_missing", {}),
            "access_log_lines_buffered": self.cut.get("access_log_lines_buffered", {}),
            # rerouted watches the drain ended (client gone: flag DC): without the drain, counted but no line
            "rerouted_watches_ended_by_drain": sum(1 for e in rerouted if "watch=" in str(e.get("path"))
                                                   and "DC" in str(e.get("flags"))),
            "events": [(round(t - self.t0, 1), w) for t, w in self.events],
            "t0": self.t0,
            "audit_series": [(round(a["t"] - self.t0, 2), a["code"], a["false404"], a["user"] == KCM_USER,
                              bool(a.get("intercepted"))) for a in audit
                             if a["user"] != "kubernetes-super-admin"],  # not the end-state reads
            "workdir": str(self.workdir),
        }


def run_one(mode: str, short: bool, base: Path, first_index: int = 1) -> dict:
    wd = base / mode
    wd.mkdir(parents=True, exist_ok=True)
    r = Run(mode, wd, short, first_index)
    t = time.monotonic()
    try:
        r.start()
        r.schedule()
        res = r.collect()
    except BaseException:
        print(r.kc.dump())
        for p in r.kcm_logs:
            print(f"===== {p} =====\n" + "".join(p.read_text(errors="replace").splitlines(True)[-30:]))
        raise
    finally:
        r.stop()
    res["timings"]["total"] = round(time.monotonic() - t, 1)
    return res


def filter_rules(r: dict) -> list[str]:
    """What a run with the filter must show; each failure is one line. Applied to the control (no
    filter) and to the mutants (kpp.testing.mutants) it must fail: tests/k8s/test_upgrade_k8s.py and
    docs/upgrade-k8s.md ("Pass rules") record which rule trips."""
    m = r["mode"]
    out = []
    if not (r["owners"] > 0 and r["dependents"] > 0):
        out.append(f"{m}: the workload made {r['owners']} owners / {r['dependents']} dependents")
    if r["lost"]:
        out.append(f"{m}: {len(r['lost'])} dependents lost although their owner exists "
                   f"(lb {r['lost_by_phase']['lb']}, node {r['lost_by_phase']['node']})")
    if r["gc_deletes_live_owner"]:
        out.append(f"{m}: the GC deleted {r['gc_deletes_live_owner']} dependents of a live owner (audit)")
    if r["false404_total"]:
        out.append(f"{m}: {r['false404_total']} false 404s reached a client {r['false404']}")
    if r["garbage_collected"] != r["garbage"]:
        out.append(f"{m}: the GC collected {r['garbage_collected']} of {r['garbage']} real garbage")
    stuck = [e["phase"] for e in r["namespaces"] if e["seconds"] is None]
    if stuck:
        out.append(f"{m}: namespace deletion stuck in phase {', '.join(stuck)}")
    codes = r.get("rerouted_codes", {})
    ok = sum(v for k, v in codes.items() if k.isdigit() and int(k) < 400 or k == "404")
    failed = sum(v for k, v in codes.items() if not k.isdigit() or int(k) >= 500 or int(k) == 0)
    if ok == 0:
        out.append(f"{m}: no rerouted request succeeded (rerouted answers by code: {codes or 'none'})")
    bound = max(MAX_REROUTE_FAILED_FLOOR, MAX_REROUTE_FAILED_SHARE * sum(codes.values()))
    if failed > bound:
        out.append(f"{m}: {failed} rerouted requests failed (> {bound:.0f}; by code: {codes})")
    bound = max(MAX_503_FLOOR, MAX_503_SHARE * r.get("client_listener_requests", 0))
    if r.get("client_listener_503", 0) > bound:
        out.append(f"{m}: clients got {r['client_listener_503']} 503s (> {bound:.0f}: "
                   f"{MAX_503_SHARE:.0%} of {r.get('client_listener_requests', 0)} requests)")
    if r["workload_errors"]:
        out.append(f"{m}: {len(r['workload_errors'])} workload errors: {r['workload_errors'][:3]}")
    if r["rerouted_metric"] != r.get("rerouted_access_log", 0):
        out.append(f"{m}: the rerouted counter says {r['rerouted_metric']}, the access logs {r['rerouted_access_log']} "
                   f"answered rerouted requests at the same cut (streams still open: {r.get('open_streams_at_cut')})")
    wl_bound = MAX_WORKLOAD_FAILED_SHARE * r["client_requests"]
    if r.get("workload_failed", 0) > wl_bound:
        out.append(f"{m}: {r['workload_failed']} of {r['client_requests']} workload requests failed "
                   f"(> {MAX_WORKLOAD_FAILED_SHARE:.0%}), e.g. {r['workload_failed_examples'][:3]}")
    if r.get("audit404_unmatched"):
        out.append(f"{m}: {r['audit404_unmatched']} audit 404s without exactly one access-log line of the same "
                   f"audit ID, e.g. {r['audit404_unmatched_examples'][:3]}")
    if not r["short"]:  # the load-balancer phase ran
        if not (r["dependents_by_phase"]["lb"] > 0 and r["owners_by_phase"]["lb"] > 0):
            out.append(f"{m}: the load-balancer phase made no owners/dependents")
    return out


def hazard_rules(r: dict) -> list[str]:
    """What the control (no filter) must show: the hazard, else the schedule proves nothing."""
    out = []
    if r["false404_total"] == 0:
        out.append("control: no false 404s (the schedule did not expose the problem)")
    if not r["lost"]:
        out.append("control: no dependent lost (the schedule did not expose the GC; see docs/upgrade-k8s.md)")
    return out


def verdict(results: list[dict]) -> list[str]:
    """Every failed rule of these runs: the filter rules for filter runs, the hazard for the control.
    A mutant passes when the filter rules *fail* for it."""
    out = []
    for r in results:
        if r["mode"] == "control":
            out += hazard_rules(r)
        elif r["mode"].startswith("mutant-"):
            if not filter_rules(r):
                out.append(f"{r['mode']}: the filter rules did not catch this mutant")
        else:
            out += filter_rules(r)
    return out


def fmt_ns(res):
    out = []
    for e in res["namespaces"]:
        out.append(f"{e['phase']}: {e['seconds']}s" if e["seconds"] is not None else f"{e['phase']}: stuck")
    return ", ".join(out) or "-"


def table(results: list[dict]) -> str:
    rows = [("", *[r["mode"] for r in results])]
    rows.append(("owners / dependents created", *[f"{r['owners']} / {r['dependents']}" for r in results]))
    for p, label in (("lb", "kcm via load balancer (upgrade)"), ("node", "kcm via cp-1's endpoint (rollback)")):
        if any(r["dependents_by_phase"][p] for r in results):
            rows.append((f"dependents lost, owner exists: {label}",
                         *[f"{r['lost_by_phase'][p]} of {r['dependents_by_phase'][p]}" for r in results]))
    rows.append(("real garbage (owner deleted first) collected by the GC",
                 *[f"{r['garbage_collected']} of {r['garbage']}" for r in results]))
    rows.append(("GC DELETEs of a dependent whose owner exists (audit)",
                 *[str(r["gc_deletes_live_owner"]) for r in results]))
    keys = sorted({k for r in results for k in r["false404"]})
    for k in keys or ["/".join(OWNER_GVR)]:
        rows.append((f"false 404s received, {k} (kcm / clients)",
                     *[f"{r['false404'].get(k, {}).get('kcm', 0)} / {r['false404'].get(k, {}).get('clients', 0)}"
                       for r in results]))
    rows.append(("apiserver 404s the filter answered as 503 instead (not seen by clients)",
                 *[str(r.get("intercepted_404", 0)) for r in results]))
    rows.append(("503s (apiserver audit / Envoy access log / workload saw)",
                 *[f"{r['audit_503']} / {r['envoy_503']} / {r['client_503']}" for r in results]))
    rows.append(("workload: 404s it received / requests", *[f"{r['client_404']} / {r['client_requests']}" for r in results]))
    rows.append(("namespace deletion", *[fmt_ns(r) for r in results]))
    rows.append(("requests rerouted (metric / access log)",
                 *[f"{r['rerouted_metric']} / {r['rerouted_access_log']}"
                   + (f" (+{r['rerouted_unanswered']} unanswered)" if r.get("rerouted_unanswered") else "")
                   for r in results]))
    rows.append(("rerouted answers by code (access log)",
                 *[", ".join(f"{k}: {v}" for k, v in sorted(r.get("rerouted_codes", {}).items())) or "-"
                   for r in results]))
    rows.append(("client-visible 503s / requests (nodes' client listeners)",
                 *[f"{r.get('client_listener_503', 0)} / {r.get('client_listener_requests', 0)}"
                   if r["mode"] != "control" else "- (tcp passthrough)" for r in results]))
    rows.append(("workload requests failed / workload errors",
                 *[f"{r.get('workload_failed', 0)} / {len(r['workload_errors'])}" for r in results]))
    rows.append(("audit 404s without one access-log line (audit ID)",
                 *[str(r.get("audit404_unmatched", 0)) if r["mode"] != "control" else "-" for r in results]))
    rows.append(("run time (s)", *[str(r["timings"].get("total")) for r in results]))
    w = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (x + 2) for x in w) + "|")
    return "\n".join(lines)


def short_label(what: str) -> str | None:
    if what.endswith(" ready") and ": v1." in what:
        node, v = what.split(": ")
        return f"{node} {v.split()[0]} up"
    if ": stop " in what:
        return what.split(":")[0] + " stop"
    if what.startswith("kube-controller-manager") and "started" in what:
        return "kcm start (" + ("LB" if "load balancer" in what else "node-local") + ")"
    if what.startswith("kube-controller-manager stopped"):
        return "kcm stop"
    if what.startswith("delete namespace"):
        return "ns delete"
    if what.startswith("garbage collector discovery sync"):
        return "GC sync"
    return None


def plot(results: list[dict], path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 3.8 * len(results)), squeeze=False)
    colors = {"ok (2xx/3xx)": "#9ecae1", "false 404": "#d62728", "404 -> 503 by the filter": "#8c564b",
              "other 404": "#fdae6b", "503": "#ff7f0e",
              "other error": "#969696"}
    for ax, res in zip(axes[:, 0], results):
        series = [x for x in res["audit_series"] if x[1] is not None]
        if not series:
            continue
        width = 5
        n = int(max(t for t, *_ in series) // width) + 1
        counts = {c: [0] * n for c in colors}
        for t, code, false404, _kcm, *rest in series:
            c = ("false 404" if false404 else "404 -> 503 by the filter" if rest and rest[0]
                 else "other 404" if code == 404 else "503" if code == 503
                 else "ok (2xx/3xx)" if code < 400 else "other error")
            counts[c][int(t // width)] += 1
        xs = [i * width for i in range(n)]
        bottom = [0] * n
        for c, ys in counts.items():
            if sum(ys):
                ax.bar(xs, ys, width=width, bottom=bottom, align="edge", color=colors[c],
                       label=f"{c} ({sum(ys)})")
                bottom = [b + y for b, y in zip(bottom, ys)]
        top = max(bottom) * 1.35 + 1
        ax.set_ylim(0, top)
        k = 0
        for t, what in res["events"]:
            lab = short_label(what)
            if not lab:
                continue
            style = {"up": ("black", "-"), "stop": ("black", ":"), "sync": ("purple", "--")}
            col, ls = next((v for key, v in style.items() if key in lab), ("green", "-."))
            ax.axvline(t, color=col, linestyle=ls, linewidth=0.8)
            ax.text(t + 0.5, top * (0.97 - 0.07 * (k % 3)), lab, fontsize=6.5, va="top", color=col)
            k += 1
        lost = sum(res["lost_by_phase"].values())
        ax.set_title(f"{res['mode']}: responses of all apiservers per {width} s (audit logs; kcm, workload and "
                     f"proxy discovery); dependents lost although their owner exists: {lost}", fontsize=9)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("responses")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", default="control,filter",
                   help=f"comma-separated modes of {MODES}; a mutant passes when the filter rules fail for it")
    p.add_argument("--short", action="store_true", help="only the node-local rollback (tests/k8s/test_upgrade_k8s.py)")
    p.add_argument("--dir", default=None)
    p.add_argument("--first-index", type=int, default=1,
                   help="node index of cp-1 (its loopback addresses: 127.0.0.1<i>, 127.0.1.1<i>; the LB one below)")
    p.add_argument("--plot", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--replot", default=None, help="only redraw --plot from this --json file")
    a = p.parse_args(argv)
    if a.replot:
        plot(json.loads(Path(a.replot).read_text()), Path(a.plot))
        return 0
    base = Path(a.dir or tempfile.mkdtemp(prefix="kpp-upgrade-k8s-"))
    t = time.monotonic()
    results = [run_one(m, a.short, base, a.first_index) for m in a.runs.split(",")]
    print(f"\nkube-apiserver {OLD} -> {NEW}, kube-controller-manager {KCM_VERSION}, workdir {base}, "
          f"total {time.monotonic() - t:.0f}s\n")
    print(table(results))
    for r in results:
        for d in r["lost"][:5]:
            print(f"  {r['mode']}: lost {d['ns']}/{d['name']} (owner {d['owner']} exists), phase {d['phase']}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    if a.plot:
        plot(results, Path(a.plot))
        print(f"plot: {a.plot}")
    for r in results:
        if r["mode"] != "filter":
            tripped = filter_rules(r)
            print(f"\nthe filter rules applied to {r['mode']}: " +
                  ("\n  " + "\n  ".join(tripped) if tripped else "all hold"))
    problems = verdict(results)
    if problems:
        print("\nFAIL:\n  " + "\n  ".join(problems))
        return 1
    print("\nPASS: every rule holds (" + ", ".join(r["mode"] for r in results) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
