"""A real control plane on loopback: one etcd, N kube-apiservers, a test aggregated API backend.

Used by tests/k8s (imported) and by hand:

    .venv/bin/python -m kpp.testing.cluster up --dir /tmp/kpp-cp                # a: v1.36.3 minus batch/v1 and
                                                                        # autoscaling/v2, b: v1.36.3 full
    .venv/bin/python -m kpp.testing.cluster up --dir /tmp/kpp-cp --mvp          # same, with the built-in MVP on
    .venv/bin/python -m kpp.testing.cluster up --server a=v1.35.4 --server b=v1.36.3

Binaries come from the cache that scripts/k8s/build.sh fills ($KPP_K8S_CACHE, default
~/.cache/kube-peer-proxy). Every kube-apiserver runs in its own UTS namespace (`unshare --uts`)
with its own hostname: the apiserver identity lease name is a hash of the hostname, so two servers
on one host would otherwise share one identity (and the built-in MVP would see no peer).

Stdlib only. Processes are owned by the Python process that started them (own process group,
PDEATHSIG), and stopped by pid.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kpp.testing.proc import (OPENER, client_tls, die_with_parent, free_port, server_tls,  # noqa: F401
                              wait_for)

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("KPP_K8S_CACHE", str(Path.home() / ".cache" / "kube-peer-proxy")))
DEFAULT_VERSION = "v1.36.3"
SKEW_OLD_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.8"
SNI = "kubernetes.default.svc"

# What `a` does not serve in the single-version topology: a whole group (batch) and one version of
# a group it still serves (autoscaling/v2, while autoscaling/v1 stays).
A_RUNTIME_CONFIG = "batch/v1=false,autoscaling/v2=false"

WARDLE_GROUP, WARDLE_VERSION = "wardle.kpp.example", "v1alpha1"
CRD_GROUP = "stable.kpp.example"

# SIGKILL, not SIGTERM: this only fires when the owner died without stop(), and then etcd goes at
# the same moment, which leaves a SIGTERMed kube-apiserver waiting in its graceful shutdown.
_die_with_parent = die_with_parent(signal.SIGKILL)


def binary(component: str, version: str) -> Path:
    """Cached binary; a clear error naming the build command if it is missing."""
    if component == "etcd" and os.environ.get("KPP_ETCD_BINARY"):
        return Path(os.environ["KPP_ETCD_BINARY"])  # e.g. Debian's /usr/bin/etcd (3.4), for comparison
    sub = "etcd" if component == "etcd" else "k8s"  # kube-apiserver, kube-controller-manager, kube-scheduler, kubeadm, kubelet
    path = CACHE / sub / version / component
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run `scripts/k8s/build.sh {component} {version}` "
                           f"(or `make k8s-build`)")
    return path


def have_binaries(versions=(DEFAULT_VERSION,)) -> bool:
    try:
        binary("etcd", ETCD_VERSION)
        for v in versions:
            binary("kube-apiserver", v)
        return True
    except RuntimeError:
        return False


def cpu_seconds(pid: int) -> float:
    """utime+stime of one process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Proc:
    """A child process in its own process group, logging to a file."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env=None):
        self.name, self.cmd, self.log_path, self.env = name, cmd, Path(log_path), env
        self.popen: subprocess.Popen | None = None

    def start(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=_die_with_parent, env=self.env)
        return self

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout: float = 20.0):
        p = self.popen
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self._log.close()
        self.popen = None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(True)[-n:])
        except FileNotFoundError:
            return ""


def make_certs(d: Path) -> Path:
    subprocess.run(["bash", str(ROOT / "scripts" / "k8s" / "certs.sh"), str(d)], check=True, timeout=120)
    return d


def read_tokens(certs: Path) -> dict[str, str]:
    out = {}
    for line in (certs / "tokens.csv").read_text().splitlines():
        tok, user = line.split(",")[:2]
        out[user] = tok
    return out


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}]
- level: None
  users: ["system:apiserver"]
- level: None
  nonResourceURLs: ["/healthz*", "/readyz*", "/livez*", "/metrics"]
- level: Metadata
"""


@dataclass
class APIServer:
    name: str
    version: str
    workdir: Path
    certs: Path
    etcd_url: str
    port: int = field(default_factory=free_port)
    runtime_config: str = ""
    mvp: bool = False
    # Writes the peer-advertise-address annotation on its identity lease (the feature gate on,
    # --peer-advertise-ip/port) without turning the built-in proxy on (no --peer-ca-file).
    advertise: bool = False
    extra_flags: list = field(default_factory=list)
    # Bound and advertised. A non-loopback address (inside a network namespace: kpp.testing.netns) lets
    # the lease endpoint reconciler run: Endpoints and EndpointSlices refuse loopback addresses.
    address: str = "127.0.0.1"
    # --endpoint-reconciler-type=lease (the default): the server writes its address into the
    # `default/kubernetes` Endpoints and EndpointSlice (needs a non-loopback `address`).
    endpoints: bool = False
    # More feature gates (name -> bool), e.g. {"AggregatedDiscoveryEndpoint": False} on v1.29.
    feature_gates: dict = field(default_factory=dict)
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def hostname(self) -> str:
        return f"kpp-apiserver-{self.name}"

    def flags(self) -> list[str]:
        c = self.certs
        f = [
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={self.port}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--cert-dir={self.workdir / 'cert-dir'}",
            f"--tls-cert-file={c / 'apiserver.crt'}",
            f"--tls-private-key-file={c / 'apiserver.key'}",
            f"--client-ca-file={c / 'ca.crt'}",
            f"--token-auth-file={c / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={c / 'sa.pub'}",
            f"--service-account-signing-key-file={c / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--enable-priority-and-fairness=true",
            # Front-proxy identity: the aggregator's requests to the aggregated backend, and the
            # built-in MVP's requests to peers (X-Remote-* headers, client cert from front-proxy-ca).
            f"--requestheader-client-ca-file={c / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={c / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={c / 'front-proxy-client.key'}",
            f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--profiling=false",
            # the kubernetes Service's endpoints cannot be a loopback address (`endpoints` needs another)
            f"--endpoint-reconciler-type={'lease' if self.endpoints else 'none'}",
            "--v=1",
        ]
        if self.minor >= 33:
            # new in v1.32 behind the alpha RemoteRequestHeaderUID gate (refused without it); beta, on, in 1.33
            f.append("--requestheader-uid-headers=X-Remote-Uid")
        if self.runtime_config:
            f.append(f"--runtime-config={self.runtime_config}")
        gates = {"UnknownVersionInteroperabilityProxy": self.mvp or self.advertise, **self.feature_gates}
        f.append("--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items()))
        if self.mvp or self.advertise:
            # The built-in Mixed Version Proxy (KEP-4020): beta and default-on in 1.36, but active
            # only with --peer-ca-file; alpha (off by default) before. `advertise` alone writes the
            # lease annotation without turning the proxy on.
            f += [f"--peer-advertise-ip={self.address}", f"--peer-advertise-port={self.port}"]
        if self.mvp:
            f.append(f"--peer-ca-file={c / 'ca.crt'}")
        return f + list(self.extra_flags)

    def start(self):
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        exe = binary("kube-apiserver", self.version)
        # unshare --uts: a hostname of its own (identity lease), same network (loopback).
        cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname,
               str(exe), *self.flags()]
        self.proc = Proc(f"apiserver-{self.name}", cmd, self.workdir / "kube-apiserver.log").start()
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.proc:
            self.proc.stop(sig)

    def wait_ready(self, token: str, ca: Path, timeout: float = 180.0):
        ctx = client_tls(ca)

        def ready():
            if not self.proc.alive():
                raise RuntimeError(f"kube-apiserver {self.name} exited:\n{self.proc.log_tail()}")
            req = urllib.request.Request(self.url + "/readyz", headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                    return r.status == 200
            except urllib.error.HTTPError:
                return False
            except OSError:
                return False

        try:
            wait_for(ready, timeout, f"kube-apiserver {self.name} /readyz", interval=0.5)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n--- log tail ---\n{self.proc.log_tail()}") from None

    def audit_events(self) -> list[dict]:
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(l) for l in text.splitlines() if l.strip()]


class WardleBackend:
    """A minimal aggregated API server (HTTPS, legacy discovery) for `wardle.kpp.example/v1alpha1`.

    The APIService points at a Service of type ExternalName `localhost` (the aggregator resolves
    those to externalName:port), so no kube-proxy, endpoints or node is needed.
    """

    def __init__(self, certs: Path):
        self.requests: list[dict] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30  # every read of a connection (and its TLS handshake, see below) is bounded

            def log_message(self, *a):
                pass

            def _send(self, code, obj, ctype="application/json"):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Kpp-Wardle", "served")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                backend.requests.append({"path": self.path, "user": self.headers.get("X-Remote-User"),
                                         "peer_proxied": self.headers.get("x-kubernetes-peer-proxied")})
                gv = f"{WARDLE_GROUP}/{WARDLE_VERSION}"
                if path == "/apis":
                    if "apidiscovery" in self.headers.get("Accept", ""):
                        return self._send(406, {"kind": "Status", "code": 406})
                    return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                        {"name": WARDLE_GROUP, "versions": [{"groupVersion": gv, "version": WARDLE_VERSION}],
                         "preferredVersion": {"groupVersion": gv, "version": WARDLE_VERSION}}]})
                if path == f"/apis/{WARDLE_GROUP}":
                    return self._send(200, {"kind": "APIGroup", "apiVersion": "v1", "name": WARDLE_GROUP,
                                            "versions": [{"groupVersion": gv, "version": WARDLE_VERSION}],
                                            "preferredVersion": {"groupVersion": gv, "version": WARDLE_VERSION}})
                if path == f"/apis/{gv}":
                    return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                                            "resources": [{"name": "flunders", "singularName": "flunder",
                                                           "namespaced": True, "kind": "Flunder",
                                                           "verbs": ["get", "list"]}]})
                if path.startswith(f"/apis/{gv}/") and path.rstrip("/").endswith("/flunders"):
                    return self._send(200, {"kind": "FlunderList", "apiVersion": gv, "metadata": {},
                                            "items": [{"kind": "Flunder", "apiVersion": gv,
                                                       "metadata": {"name": "static", "namespace": "default"}}]})
                if path == "/openapi/v2":
                    return self._send(200, {"swagger": "2.0", "info": {"title": "wardle", "version": "v1"},
                                            "paths": {}})
                if path == "/openapi/v3":
                    return self._send(200, {"paths": {}})
                if path in ("/healthz", "/readyz", "/livez"):
                    return self._send(200, "ok")
                return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "NotFound", "code": 404})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = server_tls(certs / "apiserver.crt", certs / "apiserver.key")
        # The handshake happens on the handler's first read (its thread, its timeout), not in accept():
        # a client that stalls there would otherwise block serve_forever, and stop() with it.
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def crd_manifest(plural: str, group: str = CRD_GROUP) -> dict:
    kind = plural[:-1].capitalize()
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": plural[:-1], "kind": kind},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


def bootstrap_manifests(certs: Path, wardle_port: int) -> list[dict]:
    """Objects every server sees (shared etcd): RBAC for alice, the aggregated API, a CRD."""
    ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kpp-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "kpp-tester"},
         "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
        # alice may do anything in `default` only: the proxied request is authorized as alice.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "kpp-tester", "namespace": "default"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kpp-tester"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kpp:testers"}]},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kpp-wardle", "namespace": "kpp-system"},
         "spec": {"type": "ExternalName", "externalName": "localhost",
                  "ports": [{"port": wardle_port, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": f"{WARDLE_VERSION}.{WARDLE_GROUP}"},
         "spec": {"group": WARDLE_GROUP, "version": WARDLE_VERSION, "groupPriorityMinimum": 1000,
                  "versionPriority": 15, "caBundle": ca,
                  "service": {"namespace": "kpp-system", "name": "kpp-wardle", "port": wardle_port}}},
        crd_manifest("widgets"),
    ]


class ControlPlane:
    """etcd + apiservers (+ the wardle backend), started in order, stopped in reverse."""

    def __init__(self, workdir: Path, servers: list[tuple[str, str, str]], mvp: bool = False,
                 kubectl: str | None = None, advertise: bool = False, options: dict | None = None):
        """servers: (name, version, runtime_config); advertise: see APIServer.advertise; options:
        name -> more APIServer fields for that server (address, port, endpoints, feature_gates, ...)."""
        self.options = dict(options or {})
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.certs = make_certs(self.workdir / "pki")
        self.tokens = read_tokens(self.certs)
        self.ca = self.certs / "ca.crt"
        self.kubectl = kubectl or shutil.which("kubectl") or str(ROOT / ".tools" / "bin" / "kubectl")
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.etcd: Proc | None = None
        self.wardle: WardleBackend | None = None
        self.mvp = mvp
        self.advertise = advertise
        self.servers = {name: self._server(name, version, rc) for name, version, rc in servers}

    def _server(self, name: str, version: str, runtime_config: str, **options) -> APIServer:
        options = {"mvp": self.mvp, "advertise": self.advertise, **self.options.get(name, {}), **options}
        return APIServer(name, version, self.workdir / f"apiserver-{name}", self.certs,
                         f"http://127.0.0.1:{self.etcd_port}", runtime_config=runtime_config, **options)

    def add_server(self, name: str, version: str = DEFAULT_VERSION, runtime_config: str = "",
                   timeout: float = 180.0, **options) -> APIServer:
        """Start one more kube-apiserver on the running etcd and wait until it is ready (options: more
        APIServer fields)."""
        s = self._server(name, version, runtime_config, **options)
        self.servers[name] = s
        s.start()
        s.wait_ready(self.admin_token, self.ca, timeout=timeout)
        return s

    @property
    def admin_token(self) -> str:
        return self.tokens["kpp-admin"]

    def start(self, timeout: float = 240.0):
        t0 = time.monotonic()
        d = self.workdir / "etcd"
        d.mkdir(parents=True, exist_ok=True)
        self.etcd = Proc("etcd", [
            str(binary("etcd", ETCD_VERSION)), "--name=kpp", f"--data-dir={d / 'data'}",
            f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-cluster=kpp=http://127.0.0.1:{self.etcd_peer_port}",
            "--log-level=warn", "--quota-backend-bytes=1073741824",
        ], d / "etcd.log").start()
        wait_for(lambda: self._etcd_healthy(), 30, "etcd /health")
        self.wardle = WardleBackend(self.certs).start()
        for s in self.servers.values():
            s.start()
        for s in self.servers.values():
            s.wait_ready(self.admin_token, self.ca, timeout=max(30.0, timeout - (time.monotonic() - t0)))
        self.apply(bootstrap_manifests(self.certs, self.wardle.port))
        first = next(iter(self.servers.values()))
        self.wait_established(f"widgets.{CRD_GROUP}", first)
        for s in self.servers.values():
            # listable, not just discoverable: right after Established a CRD's storage may still answer
            # 429 "storage is (re)initializing"
            for path in (f"/apis/{WARDLE_GROUP}/{WARDLE_VERSION}/namespaces/default/flunders",
                         f"/apis/{CRD_GROUP}/v1/namespaces/default/widgets"):
                wait_for(lambda s=s, path=path: self.api(s, path)[0] == 200, 60, f"{path} on {s.name}")
        self.startup_seconds = time.monotonic() - t0
        return self

    def _etcd_healthy(self) -> bool:
        with OPENER.open(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as r:
            return json.loads(r.read()).get("health") == "true"

    def stop(self):
        for s in reversed(list(self.servers.values())):
            s.stop()
        if self.wardle:
            self.wardle.stop()
            self.wardle = None
        if self.etcd:
            self.etcd.stop()

    # --- client helpers (direct to one apiserver, TLS verified against the cluster CA) ---

    def ssl_context(self) -> ssl.SSLContext:
        return client_tls(self.ca)

    def api(self, server: APIServer, path: str, method: str = "GET", body=None, token: str | None = None,
            headers: dict | None = None, timeout: float = 15.0) -> tuple[int, dict, bytes]:
        h = {"Authorization": f"Bearer {token or self.admin_token}", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(server.url + path, method=method, data=data, headers=h)
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def kubeconfig(self, server_url: str, token: str, path: Path) -> Path:
        """A kubeconfig for kubectl: https to an apiserver (cluster CA) or plain http to an Envoy."""
        cluster = {"server": server_url}
        if server_url.startswith("https://"):
            cluster["certificate-authority"] = str(self.ca)
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "kpp",
               "clusters": [{"name": "kpp", "cluster": cluster}],
               "users": [{"name": "kpp", "user": {"token": token}}],
               "contexts": [{"name": "kpp", "context": {"cluster": "kpp", "user": "kpp", "namespace": "default"}}]}
        path.write_text(json.dumps(cfg))
        return path

    def kubectl_run(self, kubeconfig: Path, *args, check=True, timeout=60, input=None):
        env = {**os.environ, "KUBECACHEDIR": str(kubeconfig.parent / "kubecache")}
        r = subprocess.run([self.kubectl, f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True,
                           timeout=timeout, env=env, input=input)
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def apply(self, objs: list[dict], server: APIServer | None = None):
        server = server or next(iter(self.servers.values()))
        kc = self.kubeconfig(server.url, self.admin_token, self.workdir / f"admin-{server.name}.kubeconfig")
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        self.kubectl_run(kc, "apply", "-f", "-", input=doc)

    def wait_established(self, crd_name: str, server: APIServer, timeout: float = 60):
        def est():
            code, _, body = self.api(server, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}")
            if code != 200:
                return False
            conds = json.loads(body).get("status", {}).get("conditions", [])
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)
        wait_for(est, timeout, f"CRD {crd_name} Established")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a control plane and keep it running until Ctrl-C")
    up.add_argument("--dir", default=None)
    up.add_argument("--server", action="append", default=[],
                    help="name=version[:runtime-config] (repeatable); default a (minus "
                         f"{A_RUNTIME_CONFIG}) and b, both {DEFAULT_VERSION}")
    up.add_argument("--mvp", action="store_true", help="enable the built-in Mixed Version Proxy")
    a = p.parse_args(argv)
    servers = []
    for spec in a.server:
        name, _, rest = spec.partition("=")
        version, _, rc = rest.partition(":")
        servers.append((name, version or DEFAULT_VERSION, rc))
    servers = servers or [("a", DEFAULT_VERSION, A_RUNTIME_CONFIG), ("b", DEFAULT_VERSION, "")]
    workdir = Path(a.dir or tempfile.mkdtemp(prefix="kpp-cp-"))
    cp = ControlPlane(workdir, servers, mvp=a.mvp)
    try:
        cp.start()
        print(f"control plane up in {cp.startup_seconds:.1f}s; workdir {workdir}")
        for s in cp.servers.values():
            print(f"  {s.name}: {s.version} {s.url} pid {s.proc.pid} runtime-config={s.runtime_config!r}")
        print(f"  admin token: {cp.admin_token}\n  CA: {cp.ca}\nCtrl-C to stop")
        # blocked, then waited for: works even where a background shell made SIGINT ignored
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cp.stop()


if __name__ == "__main__":
    main()
