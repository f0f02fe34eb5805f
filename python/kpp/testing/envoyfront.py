"""Envoy + the kube-peer-proxy filter in front of real kube-apiservers (tests/k8s and compare.py).

The bootstrap comes from kpp.render (`upstream_tls_sni="kubernetes.default.svc"` and
`upstream_ca`: upstream TLS verified with the cluster CA and that SAN, what the built-in MVP checks
too; discovery fetched with the static `kpp-discovery` token through the plugin's
`discovery_headers`). Two additions are made here, on the rendered JSON:

* downstream TLS with the apiserver's own serving certificate (SAN 127.0.0.1): kubectl/client-go
  v1.36 does not send a bearer token over plain http (the request arrives as system:anonymous), so
  a client-facing Envoy must speak https, as the apiserver it stands in for does;
* an access log (JSON lines) with the upstream cluster and the request headers *after* the filter
  ran, which is how a test sees that a rerouted request carried `x-kubernetes-peer-proxied: true`.

Envoy itself is launched only through kpp.testing.harness (func-e).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kpp import render
from kpp.testing import harness
from kpp.testing.cluster import SNI, APIServer, ControlPlane

# One discovery round per second; a server silent for 10 s stops being a routing target.
K8S_PLUGIN = {"refresh_interval": "1s", "fetch_timeout": "3s", "staleness_limit": "10s"}

ACCESS_LOG_FORMAT = {
    "path": "%REQ(:PATH)%", "method": "%REQ(:METHOD)%", "cluster": "%UPSTREAM_CLUSTER%",
    "peer_proxied": "%REQ(X-KUBERNETES-PEER-PROXIED)%", "audit_id": "%REQ(AUDIT-ID)%",
    "upstream_host": "%UPSTREAM_HOST%",
    "code": "%RESPONSE_CODE%", "flags": "%RESPONSE_FLAGS%", "duration_ms": "%DURATION%",
    "upstream_ms": "%RESPONSE_DURATION%",
}


def bootstrap(cp: ControlPlane, local: APIServer, peers: list[APIServer], listen: int, admin: int,
              access_log: Path, plugin: dict | None = None, leases: dict | None = None) -> str:
    cfg = dict(K8S_PLUGIN)
    cfg["discovery_headers"] = {"authorization": f"Bearer {cp.tokens['kpp-discovery']}"}
    cfg.update(plugin or {})
    text = render.render_bootstrap(
        node=local.name, listen_port=listen, admin_port=admin, local=(local.address, local.port),
        peers=[] if leases is not None else [(p.name, p.address, p.port) for p in peers],
        wasm_path=str(harness.wasm_path()), plugin=cfg, upstream_tls_sni=SNI, upstream_ca=str(cp.ca), leases=leases)
    b = json.loads(text)
    chain = b["static_resources"]["listeners"][0]["filter_chains"][0]
    chain["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {
            "tls_certificates": [{"certificate_chain": {"filename": str(cp.certs / "apiserver.crt")},
                                  "private_key": {"filename": str(cp.certs / "apiserver.key")}}],
            "alpn_protocols": ["h2", "http/1.1"]}}}
    hcm = chain["filters"][0]["typed_config"]
    hcm["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": str(access_log),
        "log_format": {"json_format": ACCESS_LOG_FORMAT}}}]
    return json.dumps(b, indent=2) + "\n"


class Front:
    """One Envoy in front of `local`, with every other server of the control plane as a peer."""

    def __init__(self, cp: ControlPlane, local: APIServer, workdir: Path, plugin: dict | None = None,
                 log_level: str = "info", leases: dict | None = None):
        """leases: lease mode (peers from identity leases) with these `lease_discovery` fields."""
        self.cp, self.local = cp, local
        self.workdir = Path(workdir)
        self.port, self.admin = harness.free_port(), harness.free_port()
        self.access_log = self.workdir / "access.log"
        peers = [s for s in cp.servers.values() if s is not local]
        self.yaml = bootstrap(cp, local, peers, self.port, self.admin, self.access_log, plugin, leases)
        self.envoy = harness.Envoy(self.yaml, f"k8s-{local.name}", self.admin, workdir=self.workdir / "envoy",
                                   log_level=log_level, component_log_level="wasm:info")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "Front":
        self.envoy.start()
        # Ready = the filter's discovery service has published a snapshot.
        try:
            self.envoy.wait_snapshot(timeout)
        except AssertionError:
            raise AssertionError(f"envoy {self.local.name}: no snapshot in {timeout}s\n{self.envoy.log_tail(80)}")
        return self

    def stop(self):
        self.envoy.stop()

    def access_entries(self) -> list[dict]:
        try:
            text = self.access_log.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def pids(self) -> list[int]:
        """func-e and Envoy (the process group) for CPU accounting."""
        import os
        pg = self.envoy.process.pid
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    if os.getpgid(int(d)) == pg:
                        out.append(int(d))
                except OSError:
                    pass
        return out


def dump(cp: ControlPlane, fronts: dict[str, "Front"], lines: int = 40) -> str:
    """The tails of every apiserver's and every Envoy's log (what a failed test's report shows)."""
    out = []
    for s in cp.servers.values():
        out.append(f"===== kube-apiserver {s.name} {s.version} ({s.proc.log_path if s.proc else '-'}) =====")
        out.append(s.proc.log_tail(lines) if s.proc else "")
    for name, f in fronts.items():
        out.append(f"===== envoy {name} ({f.envoy.log_path}) =====")
        out.append(f.envoy.log_tail(lines))
    return "\n".join(out)
