"""Helpers of the real-control-plane tests: an Env (control plane + one Envoy front per server),
a small HTTP(S) client, discovery helpers. Kept out of conftest.py so that `from k8senv import ...`
never picks up tests/e2e/conftest.py when both directories run in one session."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from kpp.testing import harness
from kpp.testing.cluster import A_RUNTIME_CONFIG, DEFAULT_VERSION, ControlPlane
from kpp.testing import envoyfront
from kpp.testing.envoyfront import Front
from kpp.testing.proc import Response, api_request

V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
NOPEER = V2 + ";profile=nopeer"
# How long a test waits for its request's line in an Envoy access log. Envoy writes those files every
# 10 s (--file-flush-interval-msec's default), so a 10 s wait could miss by a hair on a loaded machine;
# this bounds the evidence's arrival, not any claim.
ACCESS_LOG_WAIT = 30.0


def from_access_log(envoy, find, message: str = "", interval: float = 0.2):
    """find()'s first truthy answer, where find reads an Envoy's access log: Envoy is asked to write its
    buffered lines now (harness.Envoy.flush_logs, admin /reopen_logs) instead of at its next 10 s
    flush; a line not yet buffered then comes with a later flush, within ACCESS_LOG_WAIT."""
    envoy.flush_logs()
    return harness.wait_until(find, ACCESS_LOG_WAIT, interval, message=message)

Resp = Response


# Plain HTTP(S) client; the bearer token is the caller's, never anything the proxy adds.
http = api_request


def gvrs(doc: dict) -> set[tuple[str, str, str]]:
    """(group, version, resource) of an aggregated discovery document (Stale entries excluded)."""
    return {(g["metadata"].get("name", ""), v["version"], r["resource"])
            for g in doc.get("items", []) for v in g.get("versions", []) for r in v.get("resources") or []
            if v.get("freshness") != "Stale"}


def discovery(base: str, token: str, accept: str = NOPEER, ca: Path | None = None) -> set:
    """All GVRs of /api + /apis at base (https needs the cluster CA)."""
    out = set()
    for root in ("/api", "/apis"):
        r = http(base, root, token=token, headers={"Accept": accept}, ca=ca)
        assert r.status == 200, (base, root, r)
        out |= gvrs(r.json())
    return out


class Env:
    """What a test module gets: the control plane and one Envoy front per server."""

    def __init__(self, cp: ControlPlane, fronts: dict[str, Front]):
        self.cp, self.fronts = cp, fronts
        self.tokens = cp.tokens

    def server(self, name):
        return self.cp.servers[name]

    def direct(self, name: str, path: str, **kw) -> Resp:
        kw.setdefault("token", self.tokens["kpp-admin"])
        return http(self.cp.servers[name].url, path, ca=self.cp.ca, **kw)

    def via(self, name: str, path: str, **kw) -> Resp:
        kw.setdefault("token", self.tokens["alice"])
        return http(self.fronts[name].url, path, ca=self.cp.ca, **kw)

    def kubeconfig(self, name: str, token_user: str = "alice", direct: bool = False) -> Path:
        url = self.cp.servers[name].url if direct else self.fronts[name].url
        d = self.cp.workdir / "kubeconfigs"
        d.mkdir(exist_ok=True)
        return self.cp.kubeconfig(url, self.tokens[token_user],
                                  d / f"{name}-{token_user}-{'direct' if direct else 'envoy'}.json")

    def kubectl(self, kubeconfig: Path, *args, check=True, timeout=60, input=None):
        return self.cp.kubectl_run(kubeconfig, *args, check=check, timeout=timeout, input=input)

    def dump(self) -> str:
        return envoyfront.dump(self.cp, self.fronts)


def start_env(workdir: Path, servers: list[tuple[str, str, str]], mvp: bool = False) -> Env:
    cp = ControlPlane(workdir, servers, mvp=mvp, kubectl=str(harness.tool("kubectl")))
    fronts: dict[str, Front] = {}
    try:
        cp.start()
        for name, s in cp.servers.items():
            fronts[name] = Front(cp, s, workdir / f"front-{name}")
            fronts[name].start()
    except BaseException:
        print(Env(cp, fronts).dump())
        for f in fronts.values():
            f.stop()
        cp.stop()
        raise
    return Env(cp, fronts)


def stop_env(env: Env):
    for f in env.fronts.values():
        f.stop()
    env.cp.stop()


@contextlib.contextmanager
def dumped(request, cluster):
    """While the block runs, `request.session.kpp_env` is `cluster` (tests/k8s/conftest.py appends its
    dump() to a failing test's report); then it points at whatever it did before (the session's
    control plane, which later modules still use)."""
    previous = getattr(request.session, "kpp_env", None)
    request.session.kpp_env = cluster
    try:
        yield cluster
    finally:
        request.session.kpp_env = previous


@contextlib.contextmanager
def serving(request, cluster, start):
    """Runs `start()` (the cluster's processes); on failure prints the cluster's logs, stops it and
    re-raises. Then yields the cluster with `request.session.kpp_env` pointing at it (conftest appends
    its logs to a failing test's report), and always stops it afterwards."""
    try:
        start()
    except BaseException:
        print(cluster.dump())
        cluster.stop()
        raise
    try:
        with dumped(request, cluster):
            yield cluster
    finally:
        cluster.stop()
