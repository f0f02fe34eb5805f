"""The static pod's `envoy` container (deploy/static-pod.yaml), run as it ships.

The container's command is a bash script that runs Envoy and, on SIGTERM, turns the node unready for
the load balancer, stops accepting, waits for requests in flight and only then stops Envoy; before
Envoy starts, it waits while another process holds the admin port (a previous pod's Envoy, draining).
Tests run the manifest's own script, arguments and environment; only what differs on a test machine is
replaced: the bootstrap's path, the admin port, a unique --base-id and the harness's --concurrency (2
unless asked: several Envoys share the machine), and `envoy` on PATH is the venv's binary. The
manifest's --disable-hot-restart makes Envoy ignore --base-id (it logs "base id=0, hot restart
version=disabled"); the id still keeps apart Envoys of a manifest copy without it (a test's control).
SIGTERM goes to the script alone, as the container runtime sends it to the container's first process.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import yaml

from kpp.testing import harness

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = ROOT / "deploy" / "static-pod.yaml"
CONTAINER = "envoy"
NODE_CONFIG = "/etc/kubernetes/kube-peer-proxy/envoy.yaml"


def pod(manifest: Path = MANIFEST) -> dict:
    return yaml.safe_load(Path(manifest).read_text())


def container(manifest: Path = MANIFEST) -> dict:
    (c,) = [c for c in pod(manifest)["spec"]["containers"] if c["name"] == CONTAINER]
    return c


def env(manifest: Path = MANIFEST) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container(manifest).get("env", [])}


def drain_seconds(manifest: Path = MANIFEST) -> tuple[float, float]:
    """(KPP_UNREADY_SECONDS, KPP_DRAIN_SECONDS) as the manifest sets them."""
    e = env(manifest)
    return float(e["KPP_UNREADY_SECONDS"]), float(e["KPP_DRAIN_SECONDS"])


def command(config_path: Path | str, base_id: int, manifest: Path = MANIFEST, concurrency: int = 2) -> list[str]:
    """The container's command + args with this machine's bootstrap path, a unique base id and
    `concurrency` workers (replacing the manifest's --concurrency, which Envoy accepts only once)."""
    c = container(manifest)
    args = list(c.get("args", []))
    if args.count(NODE_CONFIG) != 1:
        raise ValueError(f"{manifest}: the {CONTAINER} container's args no longer name {NODE_CONFIG}: {args}")
    args[args.index(NODE_CONFIG)] = str(config_path)
    if "--concurrency" in args:
        i = args.index("--concurrency")
        del args[i:i + 2]
    return [*c["command"], *args, "--base-id", str(base_id), "--concurrency", str(concurrency)]


class StaticPodEnvoy(harness.Envoy):
    """harness.Envoy launched through the static pod's entrypoint script."""

    def __init__(self, *args, manifest: Path = MANIFEST, **kwargs):
        super().__init__(*args, **kwargs)
        self.manifest = manifest
        self.terminated_at: float | None = None
        self.exited_at: float | None = None

    def _command(self, config_path: Path) -> tuple[list[str], dict[str, str]]:
        bindir = self.workdir / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        link = bindir / "envoy"
        if not link.exists():
            link.symlink_to(harness.envoy_binary())
        e = dict(os.environ)
        e.update(env(self.manifest))
        e["KPP_ADMIN_PORT"] = str(self.admin_port)
        e["PATH"] = f"{bindir}:{e.get('PATH', '/usr/bin:/bin')}"
        return command(config_path, self.base_id, self.manifest, self.concurrency), e

    def terminate(self) -> float:
        """SIGTERM to the container's first process (the script), as the kubelet's runtime sends it."""
        self.terminated_at = time.monotonic()
        os.kill(self.process.pid, signal.SIGTERM)
        return self.terminated_at

    def wait_exit(self, timeout: float) -> int:
        """Waits for the script (and so Envoy) to exit; returns its exit code."""
        rc = self.process.wait(timeout)
        self.exited_at = time.monotonic()
        return rc

    def stop(self) -> None:
        """Teardown: no drain (SIGKILL the group if still running), then the harness's cleanup."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        super().stop()


ADMIN_PORT, CLIENT_PORT = 9901, 6443  # what the manifest's probes name (kpp.render's kubeadm defaults)


def probes(manifest: Path = MANIFEST) -> dict[str, tuple[str, str, str]]:
    """{probe: (listener, scheme, path)} of the envoy container: listener "admin" (127.0.0.1:9901) or
    "client" (<node-ip>:6443, the pod IP of a hostNetwork pod), so a test can send the same GET."""
    out = {}
    for name in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container(manifest)[name]["httpGet"]
        if get["port"] == ADMIN_PORT and get.get("host") == "127.0.0.1":
            listener = "admin"
        elif get["port"] == CLIENT_PORT and "host" not in get:
            listener = "client"
        else:
            raise ValueError(f"{manifest}: {name} probes something the tests do not know: {get}")
        out[name] = (listener, get.get("scheme", "HTTP"), get["path"])
    return out


def probe_headers(name: str, manifest: Path = MANIFEST) -> dict[str, str]:
    """The httpHeaders of the envoy container's probe `name`, which the kubelet sends with its own
    User-Agent (kube-probe/<major>.<minor>) and Accept."""
    return {h["name"]: h["value"] for h in container(manifest)[name]["httpGet"].get("httpHeaders", [])}
