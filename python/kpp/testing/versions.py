"""The version matrix: one upgrade step at a time, two real kube-apiservers of the two versions on one
etcd, each behind Envoy with the filter, peers learned from the `default/kubernetes` EndpointSlice.

Used by tests/versions (`make test` runs DEFAULT_STEPS, `make test-versions` every step). A step's
servers run on node addresses of kpp.testing.netns (198.18.0.11 = old, .12 = new; the lease endpoint
reconciler refuses loopback), all on port 6443 as in a real cluster, where every apiserver of the
`kubernetes` Service shares one port. Each Envoy's client listener is on 127.0.0.1 (its own port).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kpp import render
from kpp.testing import harness, netns
from kpp.testing.cluster import ControlPlane, binary
from kpp.testing import envoyfront
from kpp.testing.envoyfront import Front
from kpp.testing.proc import api_request

PORT = 6443
OLD_IP, NEW_IP = netns.NODE_ADDRESSES[0], netns.NODE_ADDRESSES[1]
SLICE = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"

# What the proxy's discovery identity needs besides system:discovery in this membership mode: the one
# EndpointSlice (by name; never a list, see src/discovery/endpoints.rs).
ENDPOINTS_RBAC = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
     "metadata": {"name": "kube-peer-proxy:endpoints", "namespace": "default"},
     "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                "resourceNames": ["kubernetes"], "verbs": ["get"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
     "metadata": {"name": "kube-peer-proxy:endpoints", "namespace": "default"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kube-peer-proxy:endpoints"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kpp-discovery"}]},
]


@dataclass(frozen=True)
class Side:
    version: str
    runtime_config: str = ""
    feature_gates: tuple = ()  # ((name, bool), ...)

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])


@dataclass(frozen=True)
class Step:
    id: str
    old: Side
    new: Side
    proves: str
    # The built-in Mixed Version Proxy on both servers (--peer-ca-file, front-proxy certificates).
    mvp: bool = False
    # Membership changes (a node joins, leaves, is replaced) are run on this step too.
    membership: bool = False

    @property
    def versions(self) -> tuple[str, str]:
        return self.old.version, self.new.version


# With their defaults a newer kube-apiserver serves everything the previous minor does (betas are off by
# default since 1.24, and GA versions are not removed), so the old server of every step also serves
# admissionregistration.k8s.io/v1beta1 (off by default in both): an API the old version had on and the
# new one does not serve, as after an upgrade that drops a beta API (flowcontrol v1beta3 in 1.32).
OLD_EXTRA = "admissionregistration.k8s.io/v1beta1=true"

STEPS = [
    Step("1.29-to-1.30", Side("v1.29.6", OLD_EXTRA), Side("v1.30.14"),
         "a v2beta1-only aggregated discovery server beside a v2 server", membership=True),
    Step("1.29-legacy-to-1.30", Side("v1.29.6", OLD_EXTRA, feature_gates=(("AggregatedDiscoveryEndpoint", False),)),
         Side("v1.30.14"), "a legacy-discovery-only server (AggregatedDiscoveryEndpoint=false)"),
    Step("1.32-to-1.33", Side("v1.32.13", OLD_EXTRA), Side("v1.33.13"), "v2beta1 disappears"),
    Step("1.33-to-1.34", Side("v1.33.13", OLD_EXTRA), Side("v1.34.4"), "the etcd and resource.k8s.io boundaries"),
    Step("1.35-to-1.36", Side("v1.35.4", OLD_EXTRA), Side("v1.36.3"),
         "the previous step (1.36 writes identity-lease addresses)"),
    Step("1.36-to-1.37", Side("v1.36.3", OLD_EXTRA), Side("v1.37.2"), "the next step users take, built-in proxy off",
         membership=True),
    Step("1.36-to-1.37-builtin-mvp", Side("v1.36.3", OLD_EXTRA), Side("v1.37.2"),
         "the same with the built-in proxy on in both servers", mvp=True),
]
BY_ID = {s.id: s for s in STEPS}
# What `make test` runs (a fresh machine builds v1.37.2 for them); `make test-versions` runs all.
DEFAULT_STEPS = ["1.35-to-1.36", "1.36-to-1.37", "1.36-to-1.37-builtin-mvp"]


def aggregated_formats(side: Side) -> dict[str, bool]:
    """Which aggregated discovery versions a server of this side serves, by the table in docs/versions.md:
    v2beta1 up to 1.32 (1.33 removes it by default), v2 from 1.30; none with AggregatedDiscoveryEndpoint off."""
    on = dict(side.feature_gates).get("AggregatedDiscoveryEndpoint", True)
    return {"v2": on and side.minor >= 30, "v2beta1": on and side.minor <= 32}


def versions_needed(step_ids) -> list[str]:
    return sorted({v for i in step_ids for v in BY_ID[i].versions}, key=lambda v: tuple(map(int, v[1:].split("."))))


def endpoints_leases(ip: str) -> dict:
    """The plugin's lease_discovery in the EndpointSlice membership mode (kpp.render adds cluster and header)."""
    return {"source": render.ENDPOINTS_SOURCE, "local_address": f"{ip}:{PORT}"}


def server_options(side: Side, ip: str, mvp: bool) -> dict:
    return {"address": ip, "port": PORT, "endpoints": True, "mvp": mvp,
            "feature_gates": dict(side.feature_gates)}


class StepEnv:
    """A step's control plane (old at OLD_IP, new at NEW_IP) and an Envoy front per server."""

    def __init__(self, workdir: Path, step: Step):
        netns.require()
        self.step = step
        self.workdir = Path(workdir)
        self.cp = ControlPlane(self.workdir, [("old", step.old.version, step.old.runtime_config),
                                              ("new", step.new.version, step.new.runtime_config)],
                               kubectl=str(harness.tool("kubectl")),
                               options={"old": server_options(step.old, OLD_IP, step.mvp),
                                        "new": server_options(step.new, NEW_IP, step.mvp)})
        self.tokens = self.cp.tokens
        self.fronts: dict[str, Front] = {}

    def start(self):
        for v in self.step.versions:
            binary("kube-apiserver", v)  # a clear error naming the build command
        self.cp.start()
        self.cp.apply(ENDPOINTS_RBAC)
        # Each server writes the slice from the master leases it sees when it reconciles (every 10 s), so
        # the one that started first lists only itself until its next round.
        want = {s.address for s in self.cp.servers.values()}
        harness.wait_until(lambda: self.slice_addresses() == want, 60, 0.3,
                           message=f"the kubernetes EndpointSlice never listed {sorted(want)}")
        for name, s in self.cp.servers.items():
            self.start_front(name)
        for f in self.fronts.values():
            f.envoy.wait_fresh(sorted(want), timeout=60)
        return self

    def start_front(self, name: str) -> Front:
        s = self.cp.servers[name]
        f = Front(self.cp, s, self.workdir / f"front-{name}", leases=endpoints_leases(s.address))
        self.fronts[name] = f
        f.start()
        return f

    def stop(self):
        for f in self.fronts.values():
            f.stop()
        self.cp.stop()

    def server(self, name):
        return self.cp.servers[name]

    def direct(self, name: str, path: str, **kw):
        kw.setdefault("token", self.tokens["kpp-admin"])
        return http(self.cp.servers[name].url, path, ca=self.cp.ca, **kw)

    def via(self, name: str, path: str, **kw):
        kw.setdefault("token", self.tokens["kpp-admin"])
        return http(self.fronts[name].url, path, ca=self.cp.ca, **kw)

    def slice_addresses(self) -> set[str]:
        r = self.direct("old", SLICE)
        if r.status != 200:
            return set()
        return {a for e in (r.json().get("endpoints") or []) for a in e.get("addresses") or []}

    def kubeconfig(self, name: str, user: str = "kpp-admin") -> Path:
        d = self.workdir / "kubeconfigs"
        d.mkdir(exist_ok=True)
        return self.cp.kubeconfig(self.fronts[name].url, self.tokens[user], d / f"{name}-{user}.json")

    def kubectl(self, kubeconfig: Path, *args, check=True, timeout=60):
        return self.cp.kubectl_run(kubeconfig, *args, check=check, timeout=timeout)

    def dump(self) -> str:
        return envoyfront.dump(self.cp, self.fronts)


http = api_request


# ---- what each server serves, from its own legacy discovery (every version has it, whatever its
# aggregated discovery format: the truth the filter's answers are compared with) ----

@dataclass
class Resource:
    group: str
    version: str
    name: str
    namespaced: bool
    kind: str
    verbs: list = field(default_factory=list)

    @property
    def gvr(self) -> tuple[str, str, str]:
        return self.group, self.version, self.name

    @property
    def gv_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection(self, namespace: str = "default") -> str:
        return f"{self.gv_path}/namespaces/{namespace}/{self.name}" if self.namespaced else f"{self.gv_path}/{self.name}"


AGGREGATED_ACCEPT = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,"
                     "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json")


def candidate_group_versions(env: StepEnv) -> set[tuple[str, str]]:
    """Every group/version either server lists, in its legacy APIGroupList or its own aggregated
    discovery. Neither list alone is the truth: the aggregator's APIGroupList comes from the APIService
    objects in the shared etcd, which each server's autoregister controller adds for the groups it
    serves and removes for those it does not, so a group one server serves can be missing from both
    servers' lists for a while."""
    out = set()
    for name in env.cp.servers:
        for root in ("/api", "/apis"):
            r = env.direct(name, root, headers={"Accept": AGGREGATED_ACCEPT})
            assert r.status == 200, (name, root, r)
            doc = r.json()
            if doc.get("kind") == "APIGroupDiscoveryList":
                out |= {(g["metadata"].get("name", ""), v["version"]) for g in doc.get("items") or []
                        for v in g.get("versions") or []}
            elif doc.get("kind") == "APIVersions":
                out |= {("", v) for v in doc["versions"]}
            elif doc.get("kind") == "APIGroupList":
                out |= {(g["name"], v["version"]) for g in doc["groups"] for v in g["versions"]}
        r = env.direct(name, "/apis", headers={"Accept": "application/json"})
        assert r.status == 200 and r.json()["kind"] == "APIGroupList", r
        out |= {(g["name"], v["version"]) for g in r.json()["groups"] for v in g["versions"]}
        # The OpenAPI v3 index (GA since 1.27) lists every group version the server's own handlers serve,
        # whatever the APIService objects say: the one list a legacy-only server has that does not flicker.
        r = env.direct(name, "/openapi/v3", headers={"Accept": "application/json"})
        assert r.status == 200, (name, r)
        for key in r.json().get("paths") or {}:
            parts = key.split("/")
            if parts[0] == "api" and len(parts) == 2:
                out.add(("", parts[1]))
            elif parts[0] == "apis" and len(parts) == 3:
                out.add((parts[1], parts[2]))
    return out


def served(env: StepEnv, name: str, candidates=None) -> dict[tuple[str, str, str], Resource]:
    """GVR -> Resource (top-level resources only) that server `name` serves: its own legacy discovery of
    each candidate group/version (`/api/<v>`, `/apis/<g>/<v>`: 200 and its resources, or 404), asked
    directly."""
    out = {}
    for g, v in sorted(candidates if candidates is not None else candidate_group_versions(env)):
        path = f"/apis/{g}/{v}" if g else f"/api/{v}"
        r = env.direct(name, path, headers={"Accept": "application/json"})
        if r.status == 404:
            continue
        assert r.status == 200, (name, path, r)
        for res in r.json().get("resources") or []:
            if "/" in res["name"]:
                continue
            out[(g, v, res["name"])] = Resource(g, v, res["name"], res["namespaced"], res["kind"], res.get("verbs") or [])
    return out


def version_of(env: StepEnv, name: str) -> str:
    return env.direct(name, "/version").json()["gitVersion"]


def git_commit(root: Path) -> str:
    r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (r.stdout.strip() or "unknown") + ("+changes" if dirty else "")
