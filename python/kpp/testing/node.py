"""Real control-plane nodes: the real kubelet, containerd and runc, driven by the real kubeadm
(tests/node, `make test-node`).

Everything from the kubelet down is the real thing; only the machine is shared. Each node is a set of
namespaces of its own, created by `unshare` (`Node.start`):

    network  eth0 198.18.1.1<i>/24 (a veth on the bridge `kpp-lan`), lo; its own 127.0.0.1, so the
             kube-apiserver binds 127.0.0.1:6443 and Envoy <node-ip>:6443 as on a real node
    mount    /etc and /var/lib are overlays of the host's (nothing is written there); /etc/kubernetes,
             /var/lib/kubelet, /var/lib/containerd and /var/log are the node's directories; /run is a
             fresh tmpfs (containerd's socket, the pods' network namespaces)
    pid      the node's init reaps orphans (containerd's shims daemonize); when the test process dies,
             the init dies (`--kill-child`) and the kernel kills everything in the namespace: no
             container, shim or kubelet outlives the run
    uts      the hostname is the node's name (the kubelet's node name, the apiserver's lease hostname)

The LAN (`Lan`) is a bridge in the run's own network namespace (kpp.testing.netns), 198.18.1.1/24, with
the registry (198.18.1.1:5000), the external etcd (198.18.1.1:2379) and the load balancer of kubeadm's HA
guide (HAProxy, 198.18.1.1:6443 = controlPlaneEndpoint). Nothing in it reaches any other network.

Per node: containerd 2.x (scripts/node/build.sh) with Debian's runc, the reference CNI plugins (a
bridge per node: kubeadm's upgrade health-check Job is an ordinary pod), and the kubelet run as
kubeadm's systemd drop-in runs it (`KubeletService`). There is no systemd: kubeadm's own `systemctl`
calls fail with a warning, and the test restarts the kubelet where kubeadm's guide says to.

Images (`Images`) are built from the same binaries the other tests run and pushed to the local
registry: kube-apiserver, kube-controller-manager and kube-scheduler of each version, pause (kubeadm's
sandbox image, from k8s.io/kubernetes' build/pause/linux/pause.c), the Envoy image (the tests' Envoy
binary on a Debian minbase userland, as the official image is Envoy on an Ubuntu base) and the
release's OCI wasm image (`make dist`).
"""
from __future__ import annotations

import hashlib
import re
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from kpp.testing import harness, netns
from kpp.testing.cluster import CACHE, ETCD_VERSION, Proc, binary
from kpp.testing.proc import die_with_parent, get_json, status, wait_for

ROOT = harness.ROOT
LAN_PREFIX = "198.18.1"
GATEWAY = f"{LAN_PREFIX}.1"
BRIDGE = "kpp-lan"
REGISTRY = f"{GATEWAY}:5000"
NODE_CACHE = CACHE / "node"
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd")


def node_tool(what: str) -> Path:
    """A piece of the node runtime (scripts/node/build.sh builds it when missing)."""
    r = subprocess.run(["bash", str(ROOT / "scripts/node/build.sh"), "--path", what], capture_output=True, text=True)
    if r.returncode != 0:
        b = subprocess.run(["bash", str(ROOT / "scripts/node/build.sh")], capture_output=True, text=True)
        if b.returncode != 0:
            raise RuntimeError(f"scripts/node/build.sh failed:\n{b.stderr[-3000:]}")
        r = subprocess.run(["bash", str(ROOT / "scripts/node/build.sh"), "--path", what], capture_output=True,
                           text=True, check=True)
    return Path(r.stdout.strip())


def run(argv: list[str], check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


# ---- the LAN: bridge, registry, etcd --------------------------------------------------------------

class Lan:
    """The bridge every node's eth0 is plugged into, in this run's network namespace."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.procs: list[Proc] = []

    def start(self):
        netns.require()
        run(["ip", "link", "add", "name", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])
        return self

    def registry(self) -> str:
        """The CNCF distribution registry (scripts/setup.sh) on GATEWAY:5000, plain HTTP (containerd's
        hosts.toml names it so): this LAN has nothing else on it."""
        d = self.workdir / "registry"
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "registry.yaml"
        cfg.write_text(json.dumps({"version": 0.1, "log": {"level": "warn"},
                                   "storage": {"filesystem": {"rootdirectory": str(d / "data")}},
                                   "http": {"addr": REGISTRY, "secret": "kube-peer-proxy-node-test"}}))
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
        p = Proc("registry", [str(harness.tool("registry")), "serve", str(cfg)], d / "registry.log", env=env).start()
        self.procs.append(p)
        wait_for(lambda: status(f"http://{REGISTRY}/v2/") == 200, 30, "the registry on " + REGISTRY)
        return REGISTRY

    def etcd(self) -> str:
        """One etcd member on GATEWAY:2379: kubeadm's external etcd."""
        d = self.workdir / "etcd"
        d.mkdir(parents=True, exist_ok=True)
        url = f"http://{GATEWAY}:2379"
        p = Proc("etcd", [str(binary("etcd", ETCD_VERSION)), "--name=kpp", f"--data-dir={d / 'data'}",
                          f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                          f"--listen-peer-urls=http://{GATEWAY}:2380", f"--initial-advertise-peer-urls=http://{GATEWAY}:2380",
                          f"--initial-cluster=kpp=http://{GATEWAY}:2380", "--log-level=warn"], d / "etcd.log").start()
        self.procs.append(p)
        wait_for(lambda: get_json(url + "/health").get("health") == "true", 30, "etcd /health")
        return url

    def stop(self):
        for p in reversed(self.procs):
            p.stop()
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


# ---- images ---------------------------------------------------------------------------------------

def _tar_layer(files: dict[str, tuple[Path | bytes, int]], dirs: dict[str, int] | None = None) -> bytes:
    """An uncompressed layer: {path in image: (source file or content, mode)}, parents created."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        made = set()

        def add_dir(d: str, mode: int = 0o755):
            parts = d.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                p = "/".join(parts[:i])
                if p and p not in made:
                    ti = tarfile.TarInfo(p)
                    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, (mode if i == len(parts) else 0o755), 0
                    t.addfile(ti)
                    made.add(p)
        for d, mode in (dirs or {}).items():
            add_dir(d, mode)
        for path, (src, mode) in sorted(files.items()):
            add_dir(str(Path(path).parent))
            data = src if isinstance(src, bytes) else Path(src).read_bytes()
            ti = tarfile.TarInfo(path.lstrip("/"))
            ti.size, ti.mode, ti.mtime = len(data), mode, 0
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def oci_layout(out: Path, layers: list[Path | bytes], config: dict) -> Path:
    """An OCI image layout (one linux/amd64 image of uncompressed layers) that `crane push` takes."""
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes | Path) -> tuple[str, int]:
        if isinstance(data, Path):
            h = hashlib.sha256()
            with open(data, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            digest, size = h.hexdigest(), data.stat().st_size
            target = blobs / digest
            if not target.exists():
                try:
                    os.link(data, target)
                except OSError:
                    shutil.copy(data, target)
        else:
            digest, size = hashlib.sha256(data).hexdigest(), len(data)
            (blobs / digest).write_bytes(data)
        return "sha256:" + digest, size
    descs = []
    for layer in layers:
        d, s = put(layer)
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": s})
    cfg = {"architecture": "amd64", "os": "linux", "config": config,
           "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in descs]}}
    cd, cs = put(json.dumps(cfg).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
                "layers": descs}
    md, ms = put(json.dumps(manifest).encode())
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
         "platform": {"architecture": "amd64", "os": "linux"}}]}))
    return out


# distroless-static's few files that components read: users, groups, a writable /tmp
_BASE_FILES = {"/etc/passwd": (b"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n", 0o644),
               "/etc/group": (b"root:x:0:\nnobody:x:65534:\n", 0o644),
               "/etc/nsswitch.conf": (b"hosts: files dns\n", 0o644)}


class Images:
    """Builds and pushes the node's images into the LAN registry; `ref(name)` is what manifests name."""

    def __init__(self, workdir: Path, registry: str = REGISTRY):
        self.workdir, self.registry = Path(workdir), registry
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pushed: dict[str, str] = {}  # ref -> digest

    def _push(self, name: str, tag: str, layout: Path, index: bool = False) -> str:
        ref = f"{self.registry}/{name}:{tag}"
        argv = [str(harness.tool("crane")), "push", str(layout), ref, "--insecure"] + (["--index"] if index else [])
        run(argv, timeout=600)
        digest = run([str(harness.tool("crane")), "digest", "--insecure", ref]).stdout.strip()
        self.pushed[ref] = digest
        return ref

    def control_plane(self, version: str) -> list[str]:
        """kube-apiserver, kube-controller-manager and kube-scheduler of `version`, each its binary in
        /usr/local/bin on distroless-static's files, as upstream's images are."""
        base = self.workdir / "layer-base.tar"
        if not base.exists():
            base.write_bytes(_tar_layer(_BASE_FILES, {"/tmp": 0o1777, "/var/run": 0o755}))
        refs = []
        for comp in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            d = self.workdir / f"{comp}-{version}"
            layer = d.with_suffix(".tar")
            layer.write_bytes(_tar_layer({f"/usr/local/bin/{comp}": (binary(comp, version), 0o755)}))
            oci_layout(d, [base, layer], {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Entrypoint": [f"/usr/local/bin/{comp}"]})
            refs.append(self._push(comp, version, d))
            layer.unlink()
        return refs

    def pause(self, tag: str) -> str:
        d = self.workdir / f"pause-{tag}"
        oci_layout(d, [_tar_layer({"/pause": (node_tool("pause"), 0o755)})],
                   {"Entrypoint": ["/pause"], "User": "65535:65535"})
        return self._push("pause", tag, d)

    def envoy(self, tag: str = "v1.40.0") -> str:
        """The Envoy image: Debian minbase (bash, dash as /bin/sh, coreutils, grep, sed; no curl) and the
        tests' Envoy at /usr/local/bin/envoy, which is what the static pod's two scripts use of the
        official image (Ubuntu 22.04 base + ca-certificates, Envoy at /usr/local/bin/envoy, no curl)."""
        d = self.workdir / f"envoy-{tag}"
        layer = d.with_suffix(".tar")
        layer.write_bytes(_tar_layer({"/usr/local/bin/envoy": (harness.envoy_binary(), 0o755)}))
        oci_layout(d, [node_tool("userland"), layer],
                   {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                    "Cmd": ["envoy", "-c", "/etc/envoy/envoy.yaml"]})
        ref = self._push("envoy", tag, d)
        layer.unlink()
        return ref

    def wasm(self, dist_oci: Path, tag: str) -> str:
        """The release's OCI image (make dist: an index of the Wasm "compat" images) as built."""
        return self._push("kube-peer-proxy", tag, dist_oci, index=True)


# ---- one node -------------------------------------------------------------------------------------

# The node's init: pid 1 of its pid namespace, reaping every orphan (shims, exited containers' parents).
_INIT = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
open(sys.argv[1], "w").write("ready\n")
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""

_SETUP = r"""set -eu
N="$KPP_NODE_DIR"
mount --make-rprivate /
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$N/ov/etc-up,workdir=$N/ov/etc-wk" /etc
mkdir -p /etc/kubernetes
mount --bind "$N/etc-kubernetes" /etc/kubernetes
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$N/ov/var-up,workdir=$N/ov/var-wk" /var/lib
mkdir -p /var/lib/kubelet /var/lib/containerd
mount --bind "$N/var-lib-kubelet" /var/lib/kubelet
mount --make-rshared /var/lib/kubelet
mount --bind "$N/var-lib-containerd" /var/lib/containerd
mount --bind "$N/var-log" /var/log
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/containerd
hostname "$KPP_NODE_NAME"
ip link set lo up
exec python3 -c "$KPP_INIT" "$N/init.ready"
"""

# kubeadm's systemd drop-in for the kubelet (kubernetes/release, cmd/krel/templates/latest/kubeadm/
# 10-kubeadm.conf), which `KubeletService` runs as systemd would:
#   Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
#   Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
#   EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
#   EnvironmentFile=-/etc/default/kubelet
#   ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
# and kubelet.service's Restart=always (RestartSec=10 there; 2 s here).
KUBELET_KUBECONFIG_ARGS = ["--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
                           "--kubeconfig=/etc/kubernetes/kubelet.conf"]
KUBELET_CONFIG_ARGS = ["--config=/var/lib/kubelet/config.yaml"]
RESTART_SEC = 2.0


def _env_file(path: Path) -> dict[str, str]:
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = " ".join(shlex.split(v))
    return out


class Node:
    def __init__(self, name: str, index: int, workdir: Path, lan: Lan):
        self.name, self.index, self.lan = name, index, lan
        self.ip = f"{LAN_PREFIX}.{10 + index}"
        self.workdir = Path(workdir)
        self.cgroup = f"kpp-{name}"
        self.holder: subprocess.Popen | None = None
        self.init_pid = 0
        self.procs: list[Proc] = []
        self.kubelet: KubeletService | None = None
        self.containerd: Proc | None = None

    # host-side paths of the node's directories
    @property
    def etc(self) -> Path:
        return self.workdir / "etc-kubernetes"

    @property
    def etc_upper(self) -> Path:
        return self.workdir / "ov" / "etc-up"

    @property
    def varlib_kubelet(self) -> Path:
        return self.workdir / "var-lib-kubelet"

    @property
    def manifests(self) -> Path:
        return self.etc / "manifests"

    def start(self):
        for d in ("etc-kubernetes", "var-lib-kubelet", "var-lib-containerd", "var-log", "ov/etc-up", "ov/etc-wk",
                  "ov/var-up", "ov/var-wk", "ov/etc-up/cni/net.d", "ov/etc-up/default"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        # the pod network: one bridge per node (pods are only kubeadm's health-check Job)
        (self.etc_upper / "cni/net.d/10-kpp.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "kpp", "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": f"10.244.{self.index}.0/24"}]]}}]}))
        # Names resolve from /etc/hosts; the LAN has no DNS server, so a lookup fails at once (port unreachable)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{LAN_PREFIX}.{10 + i} cp-{i}\n" for i in range(1, 10))
        (self.etc_upper / "hosts").write_text(hosts)
        (self.etc_upper / "resolv.conf").write_text(f"nameserver {GATEWAY}\n")
        # The kubelets of both nodes share the machine's cgroup v1 hierarchies: each its own root.
        (self.etc_upper / "default/kubelet").write_text(f"KUBELET_EXTRA_ARGS=--cgroup-root=/{self.cgroup}\n")
        for sub in CGROUP_V1:
            p = Path("/sys/fs/cgroup") / sub
            if p.is_dir():
                (p / self.cgroup).mkdir(exist_ok=True)
        ready = self.workdir / "init.ready"
        ready.unlink(missing_ok=True)
        env = {**os.environ, "KPP_NODE_DIR": str(self.workdir), "KPP_NODE_NAME": self.name, "KPP_INIT": _INIT}
        self._holder_log = open(self.workdir / "node-init.log", "ab")
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
             "--propagation", "private", "bash", "-c", _SETUP],
            env=env, stdin=subprocess.DEVNULL, stdout=self._holder_log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
        wait_for(lambda: ready.exists() or self.holder.poll() is not None, 20, f"{self.name}'s namespaces")
        if self.holder.poll() is not None:
            raise RuntimeError(f"{self.name}: the node's namespaces did not come up:\n"
                               f"{(self.workdir / 'node-init.log').read_text()[-3000:]}")
        self.init_pid = int(Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children").read_text().split()[0])
        veth = f"kpp-{self.name}"[:15]
        run(["ip", "link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", str(self.init_pid)])
        run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
        self.sh(f"ip addr add {self.ip}/24 dev eth0 && ip link set eth0 up && ip route add default via {GATEWAY} "
                "&& sysctl -qw net.ipv4.ip_forward=1")
        return self

    def prefix(self) -> list[str]:
        return ["nsenter", f"--target={self.init_pid}", "--net", "--mount", "--uts", "--pid", "--"]

    def sh(self, script: str, check: bool = True, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
        return run(self.prefix() + ["bash", "-c", script], check=check, timeout=timeout, env=env)

    def exec(self, argv: list[str], check: bool = True, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
        return run(self.prefix() + [str(a) for a in argv], check=check, timeout=timeout, env=env)

    def proc(self, name: str, argv: list[str], env=None) -> Proc:
        p = Proc(f"{self.name}-{name}", self.prefix() + [str(a) for a in argv], self.workdir / f"{name}.log", env=env)
        self.procs.append(p)
        return p

    def start_containerd(self):
        d = node_tool("containerd").parent
        cfg = self.workdir / "containerd.toml"
        certs = self.workdir / "certs.d" / REGISTRY
        certs.mkdir(parents=True, exist_ok=True)
        (certs / "hosts.toml").write_text(f'server = "http://{REGISTRY}"\n\n[host."http://{REGISTRY}"]\n'
                                          '  capabilities = ["pull", "resolve"]\n')
        cfg.write_text(f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{REGISTRY}/pause:{PAUSE_TAG}"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{self.workdir / 'certs.d'}"
[plugins.'io.containerd.cri.v1.runtime']
  # This machine's sandbox withholds CAP_SYS_RESOURCE even from root: lowering an oom_score_adj fails
  # (`echo -999 > /proc/self/oom_score_adj`: Permission denied), and runc's init then dies ("can't get
  # final child's PID from pipe: EOF") for every container the kubelet asks a negative score for (static
  # pods: -997). containerd's own switch for such hosts keeps each score at or above containerd's (0).
  restrict_oom_score_adj = true
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{node_tool('cni')}"]
  conf_dir = "/etc/cni/net.d"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    # cgroupfs: kubeadm's KubeletConfiguration here says cgroupDriver: cgroupfs (no systemd runs)
    SystemdCgroup = false
    BinaryName = "{shutil.which('runc') or '/usr/sbin/runc'}"
""")
        env = {**os.environ, "PATH": f"{d}:{os.environ['PATH']}"}
        self.containerd = self.proc("containerd", [d / "containerd", "--config", cfg], env=env).start()
        wait_for(lambda: self.exec([d / "ctr", "--address", "/run/containerd/containerd.sock", "version"],
                                   check=False).returncode == 0, 30, f"{self.name}: containerd")
        return self

    def start_kubelet(self, version: str):
        self.kubelet = KubeletService(self, version).start()
        return self.kubelet

    def stop(self):
        if self.kubelet:
            self.kubelet.stop()
        for p in reversed(self.procs):
            p.stop(signal.SIGKILL, timeout=10)
        if self.holder and self.holder.poll() is None:
            self.holder.kill()
            try:
                self.holder.wait(10)
            except subprocess.TimeoutExpired:
                pass
        # the kernel has killed the namespace's processes (pid 1 died); wait for their cgroups to empty
        deadline = time.monotonic() + 20
        for sub in CGROUP_V1:
            root = Path("/sys/fs/cgroup") / sub / self.cgroup
            if not root.is_dir():
                continue
            # deepest first; a kubelet's cgroup may vanish while this walks (the kernel, containerd)
            dirs = [Path(d) for d, _, _ in os.walk(root, topdown=False, onerror=lambda e: None)]
            for d in dirs:
                while True:
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.2)


PAUSE_TAG = "3.10.1"  # overwritten per run by NodeCluster from kubeadm's constants (3.10.1 in v1.35, 3.10.2 in v1.36)


class KubeletService:
    """The kubelet as kubeadm's systemd unit runs it: started when /var/lib/kubelet/config.yaml exists
    (kubeadm's kubelet-start phase writes it), with the drop-in's arguments read at every start, and
    restarted 2 s after it exits. `restart(version)` is the guide's `systemctl restart kubelet` after the
    package upgrade."""

    def __init__(self, node: Node, version: str):
        self.node, self.version = node, version
        self.proc: Proc | None = None
        self.starts: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._restart = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"kubelet-{node.name}")

    def start(self):
        self._thread.start()
        return self

    def args(self) -> list[str]:
        env = {**_env_file(self.node.varlib_kubelet / "kubeadm-flags.env"), **_env_file(self.node.etc_upper / "default/kubelet")}
        return [*KUBELET_KUBECONFIG_ARGS, *KUBELET_CONFIG_ARGS, *shlex.split(env.get("KUBELET_KUBEADM_ARGS", "")),
                *shlex.split(env.get("KUBELET_EXTRA_ARGS", ""))]

    def _run(self):
        while not self._stop.is_set():
            if not (self.node.varlib_kubelet / "config.yaml").is_file():
                self._stop.wait(0.5)
                continue
            self._restart.clear()
            p = Proc(f"{self.node.name}-kubelet", self.node.prefix() + [str(binary("kubelet", self.version)), *self.args()],
                     self.node.workdir / "kubelet.log")
            p.start()
            self.proc = p
            self.starts.append((time.monotonic(), self.version))
            while p.alive() and not self._stop.is_set() and not self._restart.is_set():
                self._stop.wait(0.2)
            p.stop(signal.SIGTERM, timeout=20)
            if not self._restart.is_set():
                self._stop.wait(RESTART_SEC)

    def restart(self, version: str | None = None):
        if version:
            self.version = version
        n = len(self.starts)
        self._restart.set()
        wait_for(lambda: len(self.starts) > n, 30, f"{self.node.name}: the kubelet restarted")

    def stop(self):
        self._stop.set()
        self._thread.join(30)
        if self.proc:
            self.proc.stop(signal.SIGTERM, timeout=20)


# ---- the cluster: kubeadm on real nodes, the proxy installed as docs/deploy.md says ---------------

CRI_SOCKET = "unix:///run/containerd/containerd.sock"
KPP_DIR = "/etc/kubernetes/kube-peer-proxy"
OLD, NEW = "v1.35.4", "v1.36.3"
PAUSE_TAGS = {"v1.35.4": "3.10.1", "v1.36.3": "3.10.2"}  # kubeadm's constants.PauseVersion of each
ENVOY_IMAGE = "docker.io/envoyproxy/envoy:v1.40.0"        # what deploy/static-pod.yaml names


def kubeadm_docs(node: Node, version: str, etcd: str) -> list[dict]:
    """The node's kubeadm configuration: InitConfiguration, ClusterConfiguration, KubeletConfiguration."""
    return [
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration",
         "localAPIEndpoint": {"advertiseAddress": node.ip, "bindPort": 6443},
         "nodeRegistration": {"name": node.name, "criSocket": CRI_SOCKET,
                              "kubeletExtraArgs": [{"name": "node-ip", "value": node.ip}]}},
        {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration", "kubernetesVersion": version,
         "controlPlaneEndpoint": f"{GATEWAY}:6443", "imageRepository": REGISTRY,
         "etcd": {"external": {"endpoints": [etcd]}}, "networking": {"podSubnet": "10.244.0.0/16"},
         # CoreDNS and kube-proxy are not part of what is tested (and their images are not built)
         "dns": {"disabled": True}, "proxy": {"disabled": True}},
        {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
         # no systemd on these nodes; containerd's runc uses cgroupfs too
         "cgroupDriver": "cgroupfs",
         # This machine has cgroup v1 (a hybrid hierarchy). kubelet 1.35 and later refuse to start on it
         # unless told otherwise; production nodes should run cgroup v2 (docs/deploy.md "The test node").
         "failCgroupV1": False},
    ]


def dump_yaml(docs: list[dict]) -> str:
    import yaml
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


class NodeCluster:
    """LAN, registry, etcd, HAProxy (kubeadm's HA guide) and real nodes; the steps of tests/node."""

    def __init__(self, workdir: Path, names=("cp-1", "cp-2")):
        from kpp.testing import lb
        self.workdir = Path(workdir)
        self.lan = Lan(self.workdir)
        self.images = Images(self.workdir / "images")
        self.nodes = {n: Node(n, i + 1, self.workdir / n, self.lan) for i, n in enumerate(names)}
        self.haproxy = lb.HAProxy(self.workdir / "haproxy", (GATEWAY, 6443),
                                  [(n.name, n.ip, 6443) for n in self.nodes.values()])
        self.etcd_url = ""
        self.kubeadm_log: list[tuple[str, list[str], int, str]] = []
        self.envoy_ref = ""

    def start(self):
        self.lan.start()
        self.lan.registry()
        self.etcd_url = self.lan.etcd()
        self.haproxy.start()
        self.envoy_ref = self.images.envoy()
        return self

    def stop(self):
        for n in reversed(list(self.nodes.values())):
            n.stop()
        self.haproxy.stop()
        self.lan.stop()

    @property
    def first(self) -> Node:
        return next(iter(self.nodes.values()))

    # ---- clients ----
    def admin_conf(self, server: str | None = None) -> Path:
        """cp-1's admin.conf (server: the load balancer), or a copy naming another server."""
        src = self.first.etc / "admin.conf"
        if server is None:
            return src
        out = self.workdir / f"admin-{server.replace(':', '_')}.conf"
        import re as _re
        out.write_text(_re.sub(r"server: https://\S+", f"server: https://{server}", src.read_text()))
        return out

    def kubectl(self, *args, server: str | None = None, check: bool = True, timeout: float = 60, input=None):
        env = {**os.environ, "KUBECACHEDIR": str(self.workdir / "kubecache")}
        return run([str(harness.tool("kubectl")), f"--kubeconfig={self.admin_conf(server)}", *args], check=check,
                   timeout=timeout, env=env, input=input)

    def client_cert(self) -> tuple[Path, Path, Path]:
        """(ca, cert, key) of admin.conf: kubernetes-admin (kubeadm:cluster-admins)."""
        import base64
        import yaml
        kc = yaml.safe_load((self.first.etc / "admin.conf").read_text())
        u = kc["users"][0]["user"]
        d = self.workdir / "admin-cert"
        d.mkdir(exist_ok=True)
        (d / "ca.crt").write_bytes(base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"]))
        (d / "tls.crt").write_bytes(base64.b64decode(u["client-certificate-data"]))
        (d / "tls.key").write_bytes(base64.b64decode(u["client-key-data"]))
        return d / "ca.crt", d / "tls.crt", d / "tls.key"

    def pod(self, name: str) -> dict:
        return json.loads(self.kubectl("-n", "kube-system", "get", "pod", name, "-o", "json").stdout)

    def pod_ready(self, name: str) -> bool:
        r = self.kubectl("-n", "kube-system", "get", "pod", name, "-o", "json", check=False)
        if r.returncode != 0:
            return False
        conds = {c["type"]: c["status"] for c in json.loads(r.stdout).get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    # ---- kubeadm ----
    def kubeadm(self, node: Node, version: str, *args, check: bool = True, timeout: float = 600):
        """The real kubeadm of `version` on the node; the node's kubelet binary on PATH (preflight runs
        `kubelet --version`)."""
        kubelet_version = node.kubelet.version if node.kubelet else version
        env = {**os.environ, "PATH": f"{binary('kubelet', kubelet_version).parent}:{os.environ['PATH']}"}
        r = node.exec([binary("kubeadm", version), *args], check=False, timeout=timeout, env=env)
        self.kubeadm_log.append((node.name, ["kubeadm", *args], r.returncode, r.stdout + r.stderr))
        (node.workdir / "kubeadm.log").open("a").write(f"\n$ kubeadm {' '.join(args)}  (rc {r.returncode})\n"
                                                       f"{r.stdout}\n{r.stderr}\n")
        if check and r.returncode != 0:
            raise RuntimeError(f"[{node.name}] kubeadm {' '.join(args)} failed ({r.returncode}):\n"
                               f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        return r

    def push_version(self, version: str):
        self.images.control_plane(version)
        self.images.pause(PAUSE_TAGS[version])

    # ---- the proxy, as docs/deploy.md "Install" says ----
    def render(self, node: Node, wasm: str):
        """Install step 2: the bootstrap and its SDS files, rendered on the node from its PKI."""
        node.sh(f"install -d {KPP_DIR} && cd {ROOT} && PYTHONPATH=python python3 -m kpp.render --kubeadm "
                f"/etc/kubernetes/pki --node {node.name} --node-ip {node.ip} --apiserver 127.0.0.1:6443 "
                f"--wasm {wasm} --write-sds > {KPP_DIR}/envoy.yaml")

    def install_files(self, node: Node, variant: str, wasm_ref: str = "") -> str:
        """Install steps 1, 2 and 4's copies, without the manifest: the .wasm (hostPath) or nothing (image
        volume), the bootstrap, the patches and upgrade-config.yaml. Returns the static pod's text."""
        from kpp import image_volume
        import yaml
        kpp = node.etc / "kube-peer-proxy"
        kpp.mkdir(parents=True, exist_ok=True)
        shutil.copytree(ROOT / "deploy/kubeadm/patches", kpp / "patches", dirs_exist_ok=True)
        shutil.copy(ROOT / "deploy/kubeadm/upgrade-config.yaml", kpp / "upgrade-config.yaml")
        source = (ROOT / "deploy/static-pod.yaml").read_text()
        if ENVOY_IMAGE not in source:
            raise AssertionError(f"deploy/static-pod.yaml no longer names {ENVOY_IMAGE}")
        # the only change to the manifest: the Envoy image from the node's registry (a mirror)
        source = source.replace(ENVOY_IMAGE, self.envoy_ref)
        if variant == "hostpath":
            node.sh(f"install -d {KPP_DIR} && install -m 0644 {harness.wasm_path()} {KPP_DIR}/kube_peer_proxy.wasm")
            self.render(node, f"{KPP_DIR}/kube_peer_proxy.wasm")
            return source
        self.render(node, image_volume.WASM_PATH)
        return yaml.safe_dump(image_volume.derive(yaml.safe_load(source), wasm_ref), sort_keys=False)

    def place_manifest(self, node: Node, text: str):
        tmp = node.workdir / "kube-peer-proxy.yaml.tmp"
        tmp.write_text(text)
        node.manifests.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, node.manifests / "kube-peer-proxy.yaml")  # the kubelet sees a whole file

    # ---- the node's Envoy, from inside its network namespace ----
    def envoy_admin(self, node: Node, path: str) -> str:
        r = node.exec(["python3", "-c", "import sys,urllib.request; sys.stdout.write(urllib.request.build_opener("
                       "urllib.request.ProxyHandler({})).open('http://127.0.0.1:9901' + sys.argv[1], timeout=5)"
                       ".read().decode())", path], check=False, timeout=20)
        return r.stdout if r.returncode == 0 else ""

    def envoy_stats(self, node: Node, regex: str) -> dict[str, int]:
        """Counters and gauges of the node's Envoy whose names match regex ({} while Envoy is down)."""
        import urllib.parse
        body = self.envoy_admin(node, "/stats?" + urllib.parse.urlencode({"format": "json", "filter": regex}))
        try:
            stats = json.loads(body).get("stats", []) if body else []
        except ValueError:
            return {}
        # the filter's own metrics are `wasmcustom.<name>` in /stats (Prometheus output drops the prefix)
        return {s["name"].removeprefix("wasmcustom."): s["value"] for s in stats
                if "name" in s and isinstance(s.get("value"), int)}

    def envoy_stat(self, node: Node, name: str) -> int | None:
        return self.envoy_stats(node, f"^(wasmcustom\\.)?{re.escape(name)}$").get(name)


# ---- the record of the last run in docs/deploy.md ---------------------------------------------------

RECORD_DOC = ROOT / "docs" / "deploy.md"
RECORD_BEGIN = "<!-- node-test:begin (make test-node writes this block) -->"
RECORD_END = "<!-- node-test:end -->"
RECORD_INPUTS = ("deploy", "envoy")  # the manifests, the drain and reload scripts, the bootstraps


def inputs_digest() -> str:
    """sha256 over every file under deploy/ and envoy/ (path and bytes): what a run of tests/node covers."""
    h = hashlib.sha256()
    for top in RECORD_INPUTS:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def recorded_digest(text: str | None = None) -> str | None:
    text = RECORD_DOC.read_text() if text is None else text
    m = re.search(re.escape(RECORD_BEGIN) + r".*?inputs sha256 `([0-9a-f]{64})`.*?" + re.escape(RECORD_END), text, re.S)
    return m.group(1) if m else None


def record(results: dict, commit: str) -> str:
    """The block docs/deploy.md quotes, from target/node/results.json of a passing run."""
    s3, s5 = results["step3_upgrade"], results["step5_roll"]
    rows = [
        ("3. kubeadm upgrade v1.35.4 → v1.36.3 under load", s3),
        ("5. the proxy's own manifest rolled under load", s5),
    ]
    lines = [RECORD_BEGIN,
             f"Last run: {time.strftime('%Y-%m-%d', time.gmtime())}, commit `{commit}`, inputs sha256 "
             f"`{inputs_digest()}` (deploy/ and envoy/; tests/e2e/test_node_record.py fails when they change "
             "without a new run).", "",
             "| step | requests | false 404s | failed requests | longest client wait (s) | retried |",
             "|---|---|---|---|---|---|"]
    for name, s in rows:
        lines.append(f"| {name} | {s['requests']} | {s['false_404']} | {s['failed']} | {s['longest_gap_s']} | {s['retried']} |")
    lines += ["",
              f"- kubeadm init {results.get('init_s')} s; install to a Ready proxy pod {results.get('install_to_ready_s')} s; "
              f"join to Ready {results.get('join_to_ready_s')} s; `upgrade apply` {s3.get('apply_s')} s, `upgrade node` {s3.get('node_s')} s.",
              f"- 4. `kubeadm certs renew all`: the renewed serving certificate on `<node-ip>:6443` after "
              f"{results.get('step4_reload_s')} s, same Envoy container.",
              f"- 5. the kubelet replaced the pod in {results.get('step5_roll_s')} s (the drain's 8 s unready included).",
              f"- 6. Envoy killed in its pod: Ready again after {results.get('step6_ready_again_s')} s, only with a snapshot.",
              f"- 7. `kubeadm upgrade node` without `--config`: {results.get('step7_probes_counted')} kubelet probes "
              f"counted at that node's Envoy within a minute (0 at the other node); after the fix with `--config` the count stays.",
              RECORD_END]
    return "\n".join(lines)


def write_record(results_path: Path, commit: str):
    results = json.loads(Path(results_path).read_text())
    text = RECORD_DOC.read_text()
    block = record(results, commit)
    if RECORD_BEGIN in text:
        text = re.sub(re.escape(RECORD_BEGIN) + ".*?" + re.escape(RECORD_END), lambda _: block, text, flags=re.S)
    else:
        raise SystemExit(f"{RECORD_DOC} has no {RECORD_BEGIN!r} block")
    RECORD_DOC.write_text(text)


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] != ["record"] or len(sys.argv) != 4:
        raise SystemExit("usage: python -m kpp.testing.node record RESULTS.json COMMIT")
    write_record(Path(sys.argv[2]), sys.argv[3])

