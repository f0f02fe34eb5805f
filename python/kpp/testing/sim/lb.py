"""The front load balancer: a plain Envoy listener that spreads requests round-robin over the three
apiserver Envoys. Its members come from a file (EDS over `path_config_source`), so the simulation can
take one apiserver's Envoy out of rotation while that apiserver is upgraded and put it back once it is
ready — what an operator's load balancer does with kube-apiserver's `/readyz` during a rolling upgrade.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kpp.testing.proc import get_json

CLUSTER = "apiservers"


def render_lb(listen_port: int, admin_port: int, eds_dir: Path) -> str:
    """Bootstrap of the front load balancer (JSON, valid YAML)."""
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "front",
        "codec_type": "AUTO",
        "normalize_path": False,
        "merge_slashes": False,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        "stream_idle_timeout": "0s",
        "request_timeout": "0s",
        "upgrade_configs": [{"upgrade_type": "websocket"}],
        "route_config": {"name": "front", "virtual_hosts": [{
            "name": "front", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": CLUSTER, "timeout": "0s"}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    bootstrap = {
        "node": {"id": "kube-peer-proxy-front-lb", "cluster": "front-lb"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "front",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": hcm}]}],
            }],
            "clusters": [{
                "name": CLUSTER,
                "type": "EDS",
                "connect_timeout": "1s",
                "lb_policy": "ROUND_ROBIN",
                "eds_cluster_config": {"eds_config": {
                    "resource_api_version": "V3",
                    "path_config_source": {"path": str(eds_dir / "eds.json"),
                                           "watched_directory": {"path": str(eds_dir)}}}},
            }],
        },
    }
    return json.dumps(bootstrap, indent=2) + "\n"


class FrontLB:
    """Writes the member list; `set_members` returns once the load balancer uses the new list."""

    def __init__(self, eds_dir: Path, listen_port: int, admin_port: int):
        self.eds_dir = Path(eds_dir)
        self.eds_dir.mkdir(parents=True, exist_ok=True)
        self.listen_port, self.admin_port = listen_port, admin_port
        self.version = 0
        self.members: list[int] = []

    def bootstrap(self) -> str:
        return render_lb(self.listen_port, self.admin_port, self.eds_dir)

    def write(self, ports: list[int]) -> None:
        """Atomically replaces the endpoint file (a rename is what the directory watch reacts to)."""
        self.version += 1
        self.members = list(ports)
        doc = {"version_info": str(self.version), "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": CLUSTER,
            "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                for p in ports]}],
        }]}
        tmp = self.eds_dir / f".eds-{self.version}.json"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.eds_dir / "eds.json")

    def active_ports(self) -> set[int]:
        doc = get_json(f"http://127.0.0.1:{self.admin_port}/clusters?format=json")
        ports = set()
        for cluster in doc.get("cluster_statuses", []):
            if cluster.get("name") == CLUSTER:
                for host in cluster.get("host_statuses", []):
                    ports.add(host["address"]["socket_address"]["port_value"])
        return ports

    def set_members(self, ports: list[int], timeout: float = 10.0) -> None:
        self.write(ports)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.active_ports() == set(ports):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"front LB did not switch to members {ports} within {timeout}s")
            time.sleep(0.02)
