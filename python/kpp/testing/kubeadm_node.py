"""kubeadm control-plane nodes on loopback, each with kube-peer-proxy's Envoy in front (KEP-4020
drop-in, `kpp.render.render_kubeadm`).

Used by tests/k8s/test_kubeadm.py (imported) and by hand:

    .venv/bin/python -m kpp.testing.kubeadm_node up --dir /tmp/kpp-kubeadm     # cp-1 minus batch/v1, cp-2

What is real and what is simulated:

* real: kubeadm v1.36.3 writes every certificate (`init phase certs all`), every kubeconfig
  (`init phase kubeconfig ...`) and the kube-apiserver static Pod manifest
  (`init phase control-plane apiserver --rootfs`); the real kube-apiserver binary runs with exactly
  the manifest's `command:` flags, except for the few overrides listed in `OVERRIDES` below; one
  real etcd (external etcd in kubeadm's terms); Envoy with the filter from render_kubeadm.
* simulated: the nodes share one machine, so "node i" is a set of loopback addresses:
  node IP 127.0.0.1<i> (Envoy: 6443 client listener, 6444 peer listener), the apiserver's
  node-local address 127.0.1.1<i>:6443 (127.0.0.1:6443 on a real node). kubeadm refuses a loopback
  advertiseAddress, so kubeadm is given 192.0.2.1<i> (RFC 5737 TEST-NET-1: documentation only). That
  address is only ever *written* (certificate SANs, the manifest); nothing here connects to it, and the
  apiserver runs with --advertise-address=127.0.0.1<i>. Careful: kubeadm's controller-manager.conf and
  scheduler.conf name the advertise address (use KubeadmNode.node_kubeconfig), and this machine's own
  eth0 may be in 192.0.2.0/24, so a stray dial would leave the box: kubectl_run refuses such
  kubeconfigs and apiserver_flags() never carries a 192.0.2 address. The second and later nodes get the first node's
  CA, front-proxy CA and service-account keys before `certs all`, as `kubeadm join --control-plane`
  would copy them; each node has its own serving and front-proxy-client certificates.
* no kubelet, scheduler or controller-manager runs: the controller-manager's kubeconfig is used only
  as a client identity.

Processes are owned by the Python process that started them (own process group, PDEATHSIG, see
cluster.Proc) and stopped by pid, in reverse order.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import http.client
from dataclasses import dataclass, field
from pathlib import Path

from kpp import pki_reload, render
from kpp.testing import harness
from kpp.testing.cluster import AUDIT_POLICY, CACHE, DEFAULT_VERSION, ETCD_VERSION, Proc, binary
from kpp.testing.proc import client_tls, free_port, get_json, wait_for

ROOT = harness.ROOT

APISERVER_PORT = 6443   # the apiserver's port on its node-local address (and Envoy's client port)
PEER_PORT = 6444        # Envoy's peer listener
SNI = render.KUBEADM_SNI  # kubernetes.default.svc: in every kubeadm apiserver certificate
TOKEN_USER = "kpp-token-user"
TOKEN_GROUP = "kpp:token-users"

# Only these flags of kubeadm's manifest are changed (see KubeadmNode.apiserver_flags).
OVERRIDES = ("--advertise-address", "--bind-address", "--etcd-servers", "--audit-policy-file",
             "--audit-log-path", "--audit-log-format", "--audit-log-mode", "--endpoint-reconciler-type",
             "--feature-gates", "--token-auth-file", "--runtime-config", "--profiling", "--v")


def k8s_binary(component: str, version: str) -> Path:
    """kubeadm / kube-controller-manager / kube-apiserver from scripts/k8s/build.sh's cache."""
    path = CACHE / "k8s" / version / component
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run `scripts/k8s/build.sh {component} {version}`")
    return path


def manifest_command(text: str) -> list[str]:
    """The `command:` list of the (single-container) static Pod manifest kubeadm wrote."""
    try:
        import yaml  # PyYAML, in the repo's venv
        return list(yaml.safe_load(text)["spec"]["containers"][0]["command"])
    except ImportError:
        pass
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "- command:")
    out = []
    for line in lines[start + 1:]:
        s = line.strip()
        if not s.startswith("- "):
            break
        out.append(s[2:].strip("'\""))
    return out


def flag_dict(command: list[str]) -> dict[str, str]:
    """`--name=value` flags in order (kubeadm writes every flag in that form)."""
    out = {}
    for arg in command[1:]:
        name, eq, value = arg.partition("=")
        if not name.startswith("--") or not eq:
            raise ValueError(f"unexpected kube-apiserver argument in kubeadm's manifest: {arg!r}")
        out[name] = value
    return out


def write_kubeconfig(path: Path, server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None,
                     token: str | None = None, tls_server_name: str | None = None) -> Path:
    cluster = {"server": server, "certificate-authority": str(ca)}
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    user = {}
    if cert:
        user["client-certificate"], user["client-key"] = str(cert), str(key)
    if token:
        user["token"] = token
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "kpp",
           "clusters": [{"name": "kpp", "cluster": cluster}],
           "users": [{"name": "kpp", "user": user}],
           "contexts": [{"name": "kpp", "context": {"cluster": "kpp", "user": "kpp", "namespace": "default"}}]}
    path.write_text(json.dumps(cfg, indent=1))
    return path


def kubeconfig_credentials(kubeconfig: Path, out_dir: Path) -> tuple[Path, Path]:
    """The embedded client certificate and key of a kubeadm kubeconfig, as files."""
    try:
        import yaml
        cfg = yaml.safe_load(kubeconfig.read_text())
    except ImportError:  # kubectl can convert it
        r = subprocess.run([str(harness.tool("kubectl")), "config", "view", "--raw", "-o", "json",
                            f"--kubeconfig={kubeconfig}"], capture_output=True, text=True, check=True, timeout=60)
        cfg = json.loads(r.stdout)
    user = cfg["users"][0]["user"]
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = kubeconfig.stem
    crt, key = out_dir / f"{stem}.crt", out_dir / f"{stem}.key"
    crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
    key.write_bytes(base64.b64decode(user["client-key-data"]))
    key.chmod(0o600)
    return crt, key


def openssl(*args, cwd=None):
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=cwd, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


def mint_cert(out: Path, cn: str, *, ca_crt: Path | None, ca_key: Path | None, orgs=(), eku: str = "clientAuth",
              sans: str | None = None, days: int = 2, subject: str | None = None) -> tuple[Path, Path]:
    """An EC key and a certificate for `cn` (O=each of orgs) signed by ca (or a self-signed CA when
    ca_crt is None: then the result *is* a CA). eku: extendedKeyUsage value(s), e.g. "clientAuth",
    "serverAuth"; sans: subjectAltName value, e.g. "DNS:kubernetes.default.svc,IP:127.0.0.1";
    subject: an openssl -subj string used instead of cn and orgs (attributes in certificate order,
    e.g. "/CN=a/CN=b" or "/CN=u/k8suid=1234", k8suid being the Kubernetes user-UID attribute)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    key, crt = out.with_suffix(".key"), out.with_suffix(".crt")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key))
    subj = subject or "/" + "/".join([f"O={o}" for o in orgs] + [f"CN={cn}"])
    if ca_crt is None:
        openssl("req", "-x509", "-new", "-key", str(key), "-subj", subj, "-days", str(days), "-out", str(crt),
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return crt, key
    ext = out.with_suffix(".ext")
    lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if eku:
        lines.append(f"extendedKeyUsage={eku}")
    if sans:
        lines.append(f"subjectAltName={sans}")
    ext.write_text("\n".join(lines) + "\n")
    csr = out.with_suffix(".csr")
    # `k8suid` in a subject names Kubernetes' user-UID attribute (openssl skips unknown numeric OIDs)
    cnf = out.with_suffix(".cnf")
    cnf.write_text("oid_section = oids\n[oids]\nk8suid = 1.3.6.1.4.1.57683.2\n"
                   "[req]\ndistinguished_name = dn\n[dn]\n")
    openssl("req", "-new", "-config", str(cnf), "-key", str(key), "-subj", subj, "-multivalue-rdn", "-utf8",
            "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", str(days), "-extfile", str(ext), "-out", str(crt))
    return crt, key


# ---- a small HTTPS client: client certificates, SNI override, source address -------------------

class Resp:
    def __init__(self, status, headers, body, version=None):
        self.status, self.headers, self.body, self.version = status, headers, body, version

    def json(self):
        return json.loads(self.body)

    @property
    def audit_id(self) -> str | None:
        return self.headers.get("audit-id")

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}>"


class _Conn(http.client.HTTPSConnection):
    def __init__(self, host, port, sni, **kw):
        super().__init__(host, port, **kw)
        self._sni = sni

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout, self.source_address)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._sni or self.host)


def request(host: str, port: int, path: str, *, ca: Path, method: str = "GET", cert: Path | None = None,
            key: Path | None = None, token: str | None = None, headers=None, body=None,
            source: str | None = None, sni: str | None = None, timeout: float = 20.0) -> Resp:
    """One HTTP/1.1 request over TLS (verified against ca). headers: a dict or a list of pairs, sent
    exactly as given (case kept). source: the local address to bind (distinct client IPs).
    TLS failures raise ssl.SSLError / ConnectionError (the caller decides what that means)."""
    conn = _Conn(host, port, sni, context=client_tls(ca, cert, key), timeout=timeout,
                 source_address=(source, 0) if source else None)
    try:
        hs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        if token:
            hs.append(("Authorization", f"Bearer {token}"))
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hs.append(("Content-Type", "application/json"))
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in hs:
            conn.putheader(k, v)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        r = conn.getresponse()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read(), r.version)
    finally:
        conn.close()


# ---- etcd, nodes, the control plane --------------------------------------------------------------

class Etcd:
    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.port, self.peer_port = free_port(), free_port()
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        d = self.workdir
        d.mkdir(parents=True, exist_ok=True)
        self.proc = Proc("etcd", [
            str(binary("etcd", ETCD_VERSION)), "--name=kpp", f"--data-dir={d / 'data'}",
            f"--listen-client-urls={self.url}", f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls=http://127.0.0.1:{self.peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peer_port}",
            f"--initial-cluster=kpp=http://127.0.0.1:{self.peer_port}",
            "--log-level=warn", "--quota-backend-bytes=1073741824",
        ], d / "etcd.log").start()

        def healthy():
            return get_json(self.url + "/health").get("health") == "true"
        wait_for(healthy, 30, "etcd /health")
        return self

    def stop(self):
        if self.proc:
            self.proc.stop()



def filter_metric(node, name: str) -> dict[tuple, int]:
    """{(label values...): value} of one of the filter's metrics on the node's Envoy."""
    out = {}
    for k, v in node.envoy.stats(f"kube_peer_proxy_{name};").items():
        labels = dict(p.split("=", 1) for p in k.split(";")[1:])
        out[tuple(sorted(labels.items()))] = v
    return out


def server_fresh(node) -> dict[str, int]:
    """server → kube_peer_proxy_server_fresh on the node's Envoy."""
    return {dict(k)["server"]: v for k, v in filter_metric(node, "server_fresh").items()}

@dataclass
class KubeadmNode:
    name: str
    index: int            # 1 → node IP 127.0.0.11, apiserver 127.0.1.11, kubeadm advertiseAddress 192.0.2.11
    workdir: Path
    etcd_url: str
    version: str = DEFAULT_VERSION
    runtime_config: str = ""
    token_file: Path | None = None
    extra_flags: dict = field(default_factory=dict)   # flag → value, or None: as kubeadm wrote it (or absent)
    apiserver_proc: Proc | None = None
    envoy: "harness.Envoy | None" = None
    pki_reload: Proc | None = None
    admin_port: int = 0
    kubeadm_command: list = field(default_factory=list)
    envoy_yaml: str = ""
    deploy_config: list = field(default_factory=list)
    # Inside kpp.testing.netns: the node IP is a real address there (198.18.0.<10+index>), given to kubeadm
    # as the advertise address, and the endpoint reconciler runs (it refuses loopback addresses).
    netns: bool = False

    # addresses
    @property
    def node_ip(self) -> str:
        return f"198.18.0.{10 + self.index}" if self.netns else f"127.0.0.{10 + self.index}"

    @property
    def apiserver_ip(self) -> str:
        return f"127.0.1.{10 + self.index}"

    @property
    def doc_ip(self) -> str:
        """What kubeadm believes the node's address is; never contacted (in a netns: the node IP)."""
        return self.node_ip if self.netns else f"192.0.2.{10 + self.index}"

    @property
    def hostname(self) -> str:
        return f"kpp-kubeadm-{self.name}"

    # paths
    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def rootfs(self) -> Path:
        return self.workdir / "rootfs"

    @property
    def kubeconfig_dir(self) -> Path:
        return self.workdir / "kubeconfig"

    def kubeconfig(self, which: str) -> Path:
        """admin / super-admin / controller-manager / scheduler, as kubeadm wrote them (server =
        controlPlaneEndpoint = this node's Envoy)."""
        return self.kubeconfig_dir / f"{which}.conf"

    def node_kubeconfig(self, which: str) -> Path:
        """kubeadm's kubeconfig with the documentation-only advertise address replaced by the node IP.
        kubeadm points controller-manager.conf and scheduler.conf at the node's own advertise address
        (admin.conf and super-admin.conf at controlPlaneEndpoint); on a real node that address *is* the
        node IP, i.e. Envoy's listener. Nothing may ever connect to 192.0.2.x."""
        text = self.kubeconfig(which).read_text().replace(f"https://{self.doc_ip}:", f"https://{self.node_ip}:")
        if "192.0.2." in text:
            raise AssertionError(f"{which}.conf still names a documentation-only address")
        out = self.kubeconfig_dir / f"{which}.node-ip.conf"
        out.write_text(text)
        out.chmod(0o600)
        return out

    def kubeconfig_server(self, which: str) -> str:
        for line in self.kubeconfig(which).read_text().splitlines():
            if line.strip().startswith("server:"):
                return line.split(":", 1)[1].strip()
        raise ValueError(f"no server in {which}.conf")

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def access_log(self) -> Path:
        return self.workdir / "envoy-access.log"

    @property
    def manifest(self) -> Path:
        return self.rootfs / "etc" / "kubernetes" / "manifests" / "kube-apiserver.yaml"

    def kubeadm_config(self) -> str:
        """kubeadm's v1beta4 configuration of this node. When the repo's deploy/kubeadm exists, its
        ClusterConfiguration apiServer.extraArgs and its patches directory are used too, as an
        operator would (the bind address it sets, 127.0.0.1, is then overridden per node: three
        "nodes" share this machine's 127.0.0.1)."""
        init = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
                "localAPIEndpoint": {"advertiseAddress": self.doc_ip, "bindPort": APISERVER_PORT},
                "nodeRegistration": {"name": self.name}}
        cluster = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
                   "kubernetesVersion": self.version, "clusterName": "kpp",
                   "controlPlaneEndpoint": f"{self.node_ip}:{APISERVER_PORT}",
                   "certificatesDir": str(self.pki),
                   "apiServer": {"certSANs": [self.node_ip]},
                   "etcd": {"external": {"endpoints": [self.etcd_url]}},
                   "networking": {"serviceSubnet": "10.96.0.0/16"}}
        deploy = ROOT / "deploy" / "kubeadm"
        if (deploy / "kubeadm-config.yaml").is_file():
            import yaml
            docs = [d for d in yaml.safe_load_all((deploy / "kubeadm-config.yaml").read_text()) if d]
            for d in docs:
                if d.get("kind") == "ClusterConfiguration":
                    extra = (d.get("apiServer") or {}).get("extraArgs") or []
                    if extra:
                        cluster["apiServer"]["extraArgs"] = extra
            if (deploy / "patches").is_dir():
                shutil.copytree(deploy / "patches", self.rootfs / "patches", dirs_exist_ok=True)
                init["patches"] = {"directory": "/patches"}  # inside the rootfs kubeadm chroots into
            self.deploy_config = [str((deploy / "kubeadm-config.yaml").relative_to(ROOT))]
        return "---\n".join(json.dumps(d, indent=1) + "\n" for d in (init, cluster))

    def kubeadm(self, *args):
        r = subprocess.run([str(k8s_binary("kubeadm", self.version)), *args], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"kubeadm {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r.stdout + r.stderr

    def prepare(self, first: "KubeadmNode | None" = None):
        """kubeadm phases: certificates, kubeconfigs, the apiserver manifest."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rootfs.mkdir(parents=True, exist_ok=True)
        self.pki.mkdir(parents=True, exist_ok=True)
        if first is not None:
            # what `kubeadm join --control-plane` copies (or --upload-certs downloads)
            for f in ("ca.crt", "ca.key", "front-proxy-ca.crt", "front-proxy-ca.key", "sa.key", "sa.pub"):
                shutil.copy2(first.pki / f, self.pki / f)
        cfg = self.rootfs / "kubeadm.yaml"  # inside the rootfs: `control-plane --rootfs` reads it from there
        cfg.write_text(self.kubeadm_config())
        self.kubeadm("init", "phase", "certs", "all", f"--config={cfg}")
        for which in ("admin", "super-admin", "controller-manager", "scheduler"):
            self.kubeadm("init", "phase", "kubeconfig", which, f"--config={cfg}",
                         f"--kubeconfig-dir={self.kubeconfig_dir}")
        self.kubeadm("init", "phase", "control-plane", "apiserver", "--config=/kubeadm.yaml",
                     f"--rootfs={self.rootfs}")
        self.kubeadm_command = manifest_command(self.manifest.read_text())
        return self

    def apiserver_flags(self) -> list[str]:
        flags = flag_dict(self.kubeadm_command)
        assert flags["--advertise-address"] == self.doc_ip, flags
        assert flags["--secure-port"] == str(APISERVER_PORT), flags
        flags.update({
            # never the 192.0.2 address: it is documentation-only and not on this machine
            "--advertise-address": self.node_ip,
            "--bind-address": self.apiserver_ip,
            "--etcd-servers": self.etcd_url,
            "--audit-policy-file": str(self.workdir / "audit-policy.yaml"),
            "--audit-log-path": str(self.audit_log),
            "--audit-log-format": "json",
            "--audit-log-mode": "blocking",
            # the kubernetes Service endpoints cannot be a loopback address (kubeadm's default, lease, in a netns)
            "--endpoint-reconciler-type": "lease" if self.netns else "none",
            # the built-in Mixed Version Proxy stays off: kube-peer-proxy is the one
            "--feature-gates": "UnknownVersionInteroperabilityProxy=false",
            "--profiling": "false",
            "--v": "1",
        })
        if self.token_file:
            flags["--token-auth-file"] = str(self.token_file)
        if self.runtime_config:
            flags["--runtime-config"] = self.runtime_config
        kubeadms = flag_dict(self.kubeadm_command)
        for k, v in self.extra_flags.items():
            if v is None:  # kubeadm's own value, or no such flag when kubeadm sets none
                flags.pop(k, None)
                if k in kubeadms:
                    flags[k] = kubeadms[k]
            else:
                flags[k] = v
        return [f"{k}={v}" for k, v in flags.items()]

    def changed_flags(self) -> dict[str, tuple[str | None, str]]:
        """flag → (kubeadm's value or None, ours) for every flag that differs from the manifest."""
        ours = flag_dict(["kube-apiserver", *self.apiserver_flags()])
        theirs = flag_dict(self.kubeadm_command)
        return {k: (theirs.get(k), v) for k, v in ours.items() if theirs.get(k) != v}

    def start_apiserver(self):
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        exe = binary("kube-apiserver", self.version)
        cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname,
               str(exe), *self.apiserver_flags()]
        self.apiserver_proc = Proc(f"apiserver-{self.name}", cmd, self.workdir / "kube-apiserver.log").start()
        return self

    def direct(self, path: str, **kw) -> Resp:
        """Straight to this node's apiserver (not through Envoy), as kubeadm's super-admin."""
        if "cert" not in kw and "token" not in kw:
            kw["cert"], kw["key"] = kubeconfig_credentials(self.kubeconfig("super-admin"), self.workdir / "creds")
        return request(self.apiserver_ip, APISERVER_PORT, path, ca=self.pki / "ca.crt", sni=SNI, **kw)

    def via(self, path: str, **kw) -> Resp:
        """Through this node's Envoy (the client listener, <node-ip>:6443)."""
        return request(self.node_ip, APISERVER_PORT, path, ca=self.pki / "ca.crt", **kw)

    def wait_apiserver(self, timeout: float = 240.0):
        def ready():
            if not self.apiserver_proc.alive():
                raise RuntimeError(f"kube-apiserver {self.name} exited:\n{self.apiserver_proc.log_tail()}")
            try:
                return self.direct("/readyz", timeout=5).status == 200
            except OSError:
                return False
        try:
            wait_for(ready, timeout, f"kube-apiserver {self.name} /readyz", interval=0.5)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n--- log tail ---\n{self.apiserver_proc.log_tail()}") from None

    @property
    def sds_dir(self) -> Path:
        return self.workdir / "sds"

    @property
    def reload_dir(self) -> Path:
        return self.workdir / "reload"

    def render_envoy(self, peers: list["KubeadmNode"], wasm: Path, **overrides) -> str:
        """The node's bootstrap; its SDS secret files (naming this node's PKI) are written too."""
        render.write_kubeadm_sds(self.sds_dir, self.pki, self.reload_dir)
        kw = dict(node=self.name, node_ip=self.node_ip, apiserver=(self.apiserver_ip, APISERVER_PORT),
                  wasm_path=str(wasm), peers=[(p.name, p.node_ip) for p in peers],
                  admin_port=self.admin_port, port=APISERVER_PORT, peer_port=PEER_PORT,
                  access_log=str(self.access_log), sds_dir=str(self.sds_dir))
        kw.update(overrides)
        return render.render_kubeadm(**kw)

    def start_envoy(self, peers: list["KubeadmNode"], wasm: Path, mutate=None, **overrides):
        """Envoy and, beside it as in the static pod, the pki-reload loop (renewed PKI files reload).
        mutate: a function of the bootstrap text (kpp.testing.mutants), for runs that must fail; overrides:
        passed to render_kubeadm (render_envoy), e.g. leases={"local_hostname": ...}."""
        self.admin_port = self.admin_port or free_port()
        if self.pki_reload is None:
            self.pki_reload = pki_reload.start(self.pki, self.reload_dir, self.workdir / "pki-reload.log",
                                               f"pki-reload-{self.name}")
        self.envoy_yaml = self.render_envoy(peers, wasm, **overrides)
        if mutate:
            self.envoy_yaml = mutate(self.envoy_yaml)
        self.envoy = harness.Envoy(self.envoy_yaml, f"kubeadm-{self.name}", self.admin_port,
                                   workdir=self.workdir / "envoy", log_level="info",
                                   component_log_level="wasm:info")
        self.envoy.start(wait_ready=False)
        return self

    def stop(self):
        if self.envoy:
            self.envoy.stop()
        if self.pki_reload:
            self.pki_reload.stop()
            self.pki_reload = None
        if self.apiserver_proc:
            self.apiserver_proc.stop()

    def audit_events(self) -> list[dict]:
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(l) for l in text.splitlines() if l.strip()]

    def audit_event(self, audit_id: str, timeout: float = 10.0) -> dict:
        """The ResponseComplete (or Panic) event of one request, waited for. A request that failed
        authentication (401) only ever gets a ResponseStarted event."""
        def find():
            evs = [e for e in self.audit_events() if e.get("auditID") == audit_id]
            for e in evs:
                if e.get("stage") in ("ResponseComplete", "Panic"):
                    return e
            for e in evs:
                if e.get("stage") == "ResponseStarted" and e.get("responseStatus", {}).get("code") == 401:
                    return e
            return None
        return wait_for(find, timeout, f"audit event {audit_id} on {self.name}", interval=0.2)

    def has_audit_id(self, audit_id: str) -> bool:
        return any(e.get("auditID") == audit_id for e in self.audit_events())

    def access_entries(self) -> list[dict]:
        try:
            text = self.access_log.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(l) for l in text.splitlines() if l.strip()]


def rbac_objects() -> list[dict]:
    """What `kubeadm init` itself creates for admin.conf (kubeadm:cluster-admins), plus the test
    users' rights. kube-peer-proxy's own RBAC comes from deploy/rbac.yaml (see KubeadmCluster.rbac)."""
    crb = lambda name, role, kind, subject: {  # noqa: E731
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}]}
    return [
        crb("kubeadm:cluster-admins", "cluster-admin", "Group", "kubeadm:cluster-admins"),
        # (not the aggregated `edit`: its rules are filled in by kube-controller-manager, which does not run)
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "kpp-token-user", "namespace": "default"},
         "rules": [{"apiGroups": ["", "batch"], "resources": ["configmaps", "jobs"], "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "kpp-token-user", "namespace": "default"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kpp-token-user"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TOKEN_USER}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "kpp-impersonator"},
         "rules": [{"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]}]},
        crb("kpp-impersonator", "kpp-impersonator", "User", "kpp-impersonator"),
    ]


# kube-peer-proxy's RBAC when deploy/rbac.yaml does not exist (yet): its discovery identity reads
# discovery documents (system:discovery); system:authenticated → system:discovery is Kubernetes'
# own default binding.
FALLBACK_PROXY_RBAC = [{
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
    "metadata": {"name": "kube-peer-proxy:discovery"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": render.DISCOVERY_USER}]}]


class KubeadmCluster:
    """etcd + N kubeadm nodes (apiserver + Envoy each); start() in order, stop() in reverse."""

    def __init__(self, workdir: Path, nodes: list[tuple[str, str]], version: str = DEFAULT_VERSION,
                 wasm: Path | None = None, kubectl: str | None = None, first_index: int = 1, netns: bool = False):
        """nodes: (name, runtime_config), indexed first_index.. in order (the index picks the node's
        loopback addresses, so clusters with disjoint indexes can run side by side); netns: see
        KubeadmNode.netns (the caller runs inside kpp.testing.netns)."""
        self.netns = netns
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubectl = kubectl or str(harness.tool("kubectl"))
        self.wasm = Path(wasm) if wasm else harness.wasm_path()
        self.etcd = Etcd(self.workdir / "etcd")
        self.token = secrets.token_hex(16)
        self.token_file = self.workdir / "tokens.csv"
        self.token_file.write_text(f'{self.token},{TOKEN_USER},kpp-token-uid,"{TOKEN_GROUP}"\n')
        self.nodes = {name: KubeadmNode(name, i + first_index, self.workdir / name, self.etcd.url, version, rc,
                                        token_file=self.token_file, netns=netns)
                      for i, (name, rc) in enumerate(nodes)}
        self.timings: dict[str, float] = {}
        self.rbac_source = ""

    @property
    def first(self) -> KubeadmNode:
        return next(iter(self.nodes.values()))

    def node(self, name) -> KubeadmNode:
        return self.nodes[name]

    def _timed(self, what, t0):
        self.timings[what] = round(time.monotonic() - t0, 2)

    def start(self, timeout: float = 300.0):
        t_all = time.monotonic()
        t0 = time.monotonic()
        first = None
        for n in self.nodes.values():
            n.prepare(first)
            first = first or n
        self._timed("kubeadm phases", t0)
        t0 = time.monotonic()
        self.etcd.start()
        self._timed("etcd", t0)
        t0 = time.monotonic()
        for n in self.nodes.values():
            n.start_apiserver()
        for n in self.nodes.values():
            n.wait_apiserver(timeout)
        self._timed("kube-apiservers ready", t0)
        t0 = time.monotonic()
        self.apply_rbac()
        self._timed("rbac", t0)
        t0 = time.monotonic()
        for n in self.nodes.values():
            n.start_envoy([p for p in self.nodes.values() if p is not n], self.wasm)
        for n in self.nodes.values():
            n.envoy.wait_until_ready(60)
        for n in self.nodes.values():
            try:
                n.envoy.wait_snapshot(60)
            except AssertionError:
                raise AssertionError(f"envoy {n.name}: no discovery snapshot\n{n.envoy.log_tail(80)}") from None
        self._timed("envoys ready (snapshot)", t0)
        self.timings["startup total"] = round(time.monotonic() - t_all, 2)
        return self

    def stop(self):
        for n in reversed(list(self.nodes.values())):
            n.stop()
        self.etcd.stop()

    # --- kubectl ---

    def direct_kubeconfig(self, node: KubeadmNode) -> Path:
        """super-admin straight to one apiserver (bootstrap, before any Envoy runs)."""
        crt, key = kubeconfig_credentials(node.kubeconfig("super-admin"), node.workdir / "creds")
        return write_kubeconfig(node.workdir / "super-admin-direct.json",
                                f"https://{node.apiserver_ip}:{APISERVER_PORT}", node.pki / "ca.crt",
                                cert=crt, key=key, tls_server_name=SNI)

    def kubectl_run(self, kubeconfig: Path, *args, check=True, timeout=60, input=None):
        if "192.0.2." in Path(kubeconfig).read_text():
            # documentation-only addresses: this machine's eth0 may even be in 192.0.2.0/24
            raise AssertionError(f"{kubeconfig} names a 192.0.2.x server; use KubeadmNode.node_kubeconfig")
        env = {**os.environ, "KUBECACHEDIR": str(self.workdir / "kubecache" / Path(kubeconfig).stem)}
        env.pop("HTTPS_PROXY", None), env.pop("https_proxy", None)
        r = subprocess.run([self.kubectl, f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True,
                           timeout=timeout, env=env, input=input)
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def apply(self, objs: list[dict] | str, kubeconfig: Path | None = None):
        kc = kubeconfig or self.direct_kubeconfig(self.first)
        doc = objs if isinstance(objs, str) else json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        return self.kubectl_run(kc, "apply", "-f", "-", input=doc)

    def apply_rbac(self):
        self.apply(rbac_objects())
        rbac = ROOT / "deploy" / "rbac.yaml"
        if rbac.is_file():
            self.apply(rbac.read_text())
            self.rbac_source = str(rbac.relative_to(ROOT))
        else:
            self.apply(FALLBACK_PROXY_RBAC)
            self.rbac_source = "inline fallback (deploy/rbac.yaml missing): " + ", ".join(
                o["metadata"]["name"] for o in FALLBACK_PROXY_RBAC)

    def dump(self) -> str:
        out = []
        for n in self.nodes.values():
            if n.apiserver_proc:
                out.append(f"===== kube-apiserver {n.name} ({n.apiserver_proc.log_path}) =====")
                out.append(n.apiserver_proc.log_tail(30))
            if n.envoy:
                out.append(f"===== envoy {n.name} ({n.envoy.log_path}) =====")
                out.append(n.envoy.log_tail(30))
        return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the nodes and keep them running until Ctrl-C")
    up.add_argument("--dir", default=None)
    up.add_argument("--node", action="append", default=[],
                    help="name[:runtime-config] (repeatable); default cp-1:batch/v1=false and cp-2")
    a = p.parse_args(argv)
    nodes = [tuple(s.split(":", 1)) if ":" in s else (s, "") for s in a.node] or \
        [("cp-1", "batch/v1=false"), ("cp-2", "")]
    workdir = Path(a.dir or tempfile.mkdtemp(prefix="kpp-kubeadm-"))
    c = KubeadmCluster(workdir, nodes)
    try:
        c.start()
        print(f"up: {c.timings}; workdir {workdir}; RBAC: {c.rbac_source}")
        for n in c.nodes.values():
            print(f"  {n.name}: envoy {n.node_ip}:{APISERVER_PORT} (peers :{PEER_PORT}, admin {n.admin_port}), "
                  f"kube-apiserver {n.apiserver_ip}:{APISERVER_PORT} pid {n.apiserver_proc.pid}; "
                  f"kubectl --kubeconfig {n.kubeconfig('admin')}")
        print("Ctrl-C to stop")
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        c.stop()


if __name__ == "__main__":
    main()
