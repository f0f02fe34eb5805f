"""The demo topology for tests: fake apiservers a (old, 1.33 API set), b and c (new, 1.37-dev set)
sharing one store, and real Envoy with the real .wasm in front of a (peers b and c)."""

from __future__ import annotations

import json

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.proc import Response, request  # noqa: F401 - re-exported: the tests import them from here

V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
NOPEER = V2 + ";profile=nopeer"
# kubectl/client-go 1.30–1.36 discovery Accept.
KUBECTL_ACCEPT = (V2 + ",application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
                  "application/json")

# Resources of the demo topology (a old: the 1.33 API set; b, c new: the 1.37-dev set).
NEW_ONLY = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
OLD_ONLY = "/apis/resource.k8s.io/v1alpha3/namespaces/default/resourceclaims"
COMMON = "/apis/apps/v1/namespaces/default/deployments"
NOWHERE = "/apis/nothing.example.com/v1/widgets"

# Plugin settings that make tests quick without racing: a round every 500 ms.
FAST = {"refresh_interval": "500ms", "fetch_timeout": "1s", "staleness_limit": "5s"}


class Topology:
    """Fake apiservers plus one Envoy (with the filter) in front of `a`."""

    def __init__(self, envoys):
        self.envoys = envoys
        self.cluster = Cluster()
        self.a = self.cluster.start("a", apiset="old")
        self.b = self.cluster.start("b", apiset="new")
        self.c = self.cluster.start("c", apiset="new")
        self.envoy = None
        self.port = None

    def bootstrap(self, plugin: dict | None = None, **kwargs) -> tuple[str, int, int]:
        port, admin = harness.free_port(), harness.free_port()
        cfg = dict(FAST)
        cfg.update(plugin or {})
        yaml = render.render_bootstrap(
            node="a", listen_port=port, admin_port=admin, local=("127.0.0.1", self.a.port),
            peers=[("b", "127.0.0.1", self.b.port), ("c", "127.0.0.1", self.c.port)],
            wasm_path=str(harness.wasm_path()), plugin=cfg, **kwargs)
        return yaml, port, admin

    def start(self, plugin: dict | None = None, wait_snapshot: bool = True, concurrency: int = 2,
              **kwargs) -> "Topology":
        yaml, self.port, admin = self.bootstrap(plugin, **kwargs)
        self.envoy = self.envoys.start(yaml, "a", admin, concurrency=concurrency)
        if wait_snapshot:
            self.envoy.wait_snapshot(20)
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, accept: str | None = None, **headers) -> Response:
        h = {k.replace("_", "-"): v for k, v in headers.items()}
        if accept:
            h["Accept"] = accept
        return request(self.url(path), headers=h)

    def send(self, method: str, path: str, obj=None, **headers) -> Response:
        h = {"Content-Type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
        body = json.dumps(obj).encode() if obj is not None else None
        return request(self.url(path), method=method, headers=h, body=body)

    def fake_requests(self, inst) -> list[dict]:
        return request(f"{inst.url}/__fake/requests").json()

    def counter(self, prefix: str) -> int:
        """Sum of Envoy counters whose name starts with `wasmcustom.<prefix>`."""
        stats = self.envoy.stats()
        return sum(v for k, v in stats.items() if k.startswith("wasmcustom." + prefix))

    def close(self):
        self.cluster.stop_all()
