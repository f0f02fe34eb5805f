"""`kubeadm upgrade` on the loopback kubeadm nodes of kpp.testing.kubeadm_node (tests/k8s/test_kubeadm_upgrade.py).

kubeadm's upgrade commands take no --rootfs-like paths: they read /etc/kubernetes/{admin,kubelet}.conf,
/etc/kubernetes/manifests, the PKI at the ClusterConfiguration's certificatesDir (one value for the
whole cluster, from the kubeadm-config ConfigMap) and write /var/lib/kubelet. So every kubeadm command
of a node runs in a private mount namespace (`NodeRoot.kubeadm`) in which

    /etc              an overlay of the host's /etc (nothing is written to the host's /etc)
    /etc/kubernetes   <node>/etc-kubernetes: admin.conf, super-admin.conf, controller-manager.conf,
                      scheduler.conf, kubelet.conf (each naming a loopback server, see below),
                      kube-peer-proxy/{patches,upgrade-config.yaml} (copies of deploy/kubeadm)
    /etc/kubernetes/pki        the node's PKI (KubeadmNode.pki, the files its Envoy reads)
    /etc/kubernetes/manifests  the node's static Pod manifests (KubeadmNode.manifest's directory)
    /var/lib/kubelet  <node>/var-lib-kubelet

and certificatesDir is /etc/kubernetes/pki, as on a real node. The new kube-apiserver is started in the
same kind of namespace (`NodeRoot.apiserver_proc`), so the manifest's /etc/kubernetes/pki paths are the
ones it reads, as the kubelet's hostPath mounts would give them.

What a kubelet would have done (no kubelet runs here) is done by `KubeletStandIn`, and only that:
register the Node object (kubeadm's own `init phase mark-control-plane` then labels and taints it) and
mirror each static Pod manifest into a Pod object (`<component>-<node>`, with the manifest's
annotations, kubeadm reads the advertise address from it); during an upgrade, `StaticPods` restarts
the kube-apiserver from each new manifest. kubeadm names the documentation-only advertise address
192.0.2.<10+i> (see kpp.testing.kubeadm_node) in kubelet.conf, controller-manager.conf and scheduler.conf:
/etc/kubernetes gets their node-IP copies, and every kubeconfig there is checked to name no 192.0.2
address before kubeadm runs. kubeadm itself runs in `PrivateNet`, where that address is unreachable.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import yaml

from kpp.testing import harness
from kpp.testing.cluster import Proc, _die_with_parent, binary  # SIGKILL, as the nodes' processes
from kpp.testing.kubeadm_node import APISERVER_PORT, KubeadmCluster, KubeadmNode, flag_dict, k8s_binary, manifest_command

ROOT = harness.ROOT
DEPLOY_KUBEADM = ROOT / "deploy" / "kubeadm"
KPP_DIR = "/etc/kubernetes/kube-peer-proxy"
CRI_SOCKET = "unix:///var/run/containerd/containerd.sock"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")

# Mount the node's directories over /etc/kubernetes and /var/lib/kubelet, then exec the command.
_NS_SCRIPT = r"""set -eu
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$KPP_OV/etc-up,workdir=$KPP_OV/etc-wk" /etc
mkdir -p /etc/kubernetes
mount --bind "$KPP_ETC" /etc/kubernetes
mount --bind "$KPP_PKI" /etc/kubernetes/pki
mount --bind "$KPP_MANIFESTS" /etc/kubernetes/manifests
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$KPP_OV/var-up,workdir=$KPP_OV/var-wk" /var/lib
mkdir -p /var/lib/kubelet
mount --bind "$KPP_VARLIB" /var/lib/kubelet
if [ -n "${KPP_HOSTNAME:-}" ]; then hostname "$KPP_HOSTNAME"; fi
exec "$@"
"""


_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


class PrivateNet:
    """A network namespace whose only interface is lo (127.0.0.0/8, no other route): inside it, a dial
    to any other address fails at once with "network is unreachable", so nothing kubeadm does can leave
    the machine. Forwarders carry the named loopback endpoints (the nodes' Envoys, etcd) in: a listener
    inside the namespace on the same address and port, relayed to that address in the host namespace.
    kubeadm's own init phases do dial the advertise address (192.0.2.1<i> here) when they bootstrap
    admin.conf (`EnsureAdminClusterRoleBinding` with the LocalAPIEndpoint): run here, they fail instead."""

    def __init__(self, forwards: list[tuple[str, int]]):
        self.forwards = forwards
        self.holder: subprocess.Popen | None = None
        self.listeners: list[socket.socket] = []
        self.relayed: list[socket.socket] = []  # both ends of every relayed connection, shut at stop()
        self.connections = {f"{h}:{p}": 0 for h, p in forwards}
        self._stop = False

    def start(self):
        self.holder = subprocess.Popen(["unshare", "--net", "sh", "-c", "ip link set lo up && exec sleep 100000"],
                                       start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 10
        host_ns = os.readlink("/proc/self/ns/net")
        # until unshare(2) has run, /proc/<pid>/ns/net is still the host's namespace
        while os.readlink(f"/proc/{self.holder.pid}/ns/net") == host_ns or \
                "UP" not in self.run(["ip", "-o", "link", "show", "lo"]).stdout:
            if time.monotonic() > deadline:
                raise RuntimeError("the private network namespace's lo did not come up")
            time.sleep(0.05)
        ns = os.open(f"/proc/{self.holder.pid}/ns/net", os.O_RDONLY)
        try:
            for host, port in self.forwards:
                got: list = []

                def listen():  # a thread of its own: setns changes only the calling thread's namespace
                    try:
                        if _libc.setns(ns, _CLONE_NEWNET) != 0:
                            raise OSError(ctypes.get_errno(), "setns")
                        got.append(socket.create_server((host, port)))
                    except Exception as e:  # noqa: BLE001 - re-raised in start()
                        got.append(e)
                t = threading.Thread(target=listen)
                t.start()
                t.join(10)
                if not got:
                    raise RuntimeError(f"no listener on {host}:{port} in the private namespace within 10 s")
                if isinstance(got[0], Exception):
                    raise got[0]
                self.listeners.append(got[0])
                threading.Thread(target=self._accept, args=(got[0], host, port), daemon=True).start()
        finally:
            os.close(ns)
        return self

    def _accept(self, lsock: socket.socket, host: str, port: int):
        while not self._stop:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            self.connections[f"{host}:{port}"] += 1
            try:
                u = socket.create_connection((host, port), timeout=5)  # this thread is in the host namespace
            except OSError:
                c.close()
                continue
            u.settimeout(None)  # (a long-lived watch may be quiet; stop() shuts the sockets, ending the pumps)
            self.relayed += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def prefix(self) -> list[str]:
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net"]

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(self.prefix() + argv, capture_output=True, text=True, timeout=10)

    def stop(self):
        self._stop = True
        for s in self.listeners:
            s.close()
        for s in self.relayed:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.holder and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(5)


class NodeRoot:
    """One node's /etc/kubernetes and /var/lib/kubelet, and commands run against them."""

    def __init__(self, node: KubeadmNode, net: PrivateNet | None = None):
        self.node, self.net = node, net
        self.etc = node.workdir / "etc-kubernetes"
        self.varlib = node.workdir / "var-lib-kubelet"
        self.log: list[tuple[list[str], int, str, str]] = []  # (argv, rc, stdout, stderr) of every kubeadm run

    @property
    def manifests(self) -> Path:
        return self.node.manifest.parent

    def install(self):
        """The directories and kubeconfigs; the patches and upgrade-config.yaml as an operator copies them."""
        for d in (self.etc / "pki", self.etc / "manifests", self.varlib, self.manifests):
            d.mkdir(parents=True, exist_ok=True)
        kpp = self.etc / "kube-peer-proxy"
        shutil.copytree(DEPLOY_KUBEADM / "patches", kpp / "patches", dirs_exist_ok=True)
        shutil.copy(DEPLOY_KUBEADM / "upgrade-config.yaml", kpp / "upgrade-config.yaml")
        self.refresh_kubeconfigs()
        return self

    def refresh_kubeconfigs(self):
        """kubeadm's kubeconfigs with the documentation-only advertise address replaced by the node IP
        (KubeadmNode.node_kubeconfig); admin.conf and super-admin.conf already name controlPlaneEndpoint
        (the node's Envoy)."""
        for which in ("admin", "super-admin", "controller-manager", "scheduler", "kubelet"):
            if self.node.kubeconfig(which).is_file():
                shutil.copy(self.node.node_kubeconfig(which), self.etc / f"{which}.conf")
                (self.etc / f"{which}.conf").chmod(0o600)

    def doc_address_kubeconfigs(self) -> dict[str, str]:
        """/etc/kubernetes/*.conf that name the documentation-only advertise address, with the server."""
        out = {}
        for f in sorted(self.etc.glob("*.conf")):
            m = re.search(r"server:\s*(https://192\.0\.2\.\d+:\d+)", f.read_text())
            if m:
                out[f.name] = m.group(1)
        return out

    def loopback_kubeconfigs(self):
        """Replace the documentation-only advertise address by the node IP in /etc/kubernetes/*.conf
        (on a real node that address is the node IP, Envoy's)."""
        for name in self.doc_address_kubeconfigs():
            f = self.etc / name
            f.write_text(f.read_text().replace(f"https://{self.node.doc_ip}:", f"https://{self.node.node_ip}:"))

    def _check_no_doc_address(self):
        for f in self.etc.glob("*.conf"):
            if "192.0.2." in f.read_text():
                raise AssertionError(f"{f} names a documentation-only 192.0.2 address")

    def ns_command(self, argv: list[str], hostname: str | None = None) -> tuple[list[str], dict]:
        ov = Path(tempfile.mkdtemp(prefix="ns-", dir=self.node.workdir))
        for d in ("etc-up", "etc-wk", "var-up", "var-wk"):
            (ov / d).mkdir()
        env = {**os.environ, "KPP_OV": str(ov), "KPP_ETC": str(self.etc), "KPP_PKI": str(self.node.pki),
               "KPP_MANIFESTS": str(self.manifests), "KPP_VARLIB": str(self.varlib), "KPP_HOSTNAME": hostname or ""}
        for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
            env.pop(k, None)
        flags = ["--mount", "--propagation", "private"] + (["--uts"] if hostname else [])
        return ["unshare", *flags, "sh", "-c", _NS_SCRIPT, "kpp-node-ns", *argv], env

    def kubeadm(self, version: str, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        """The real kubeadm of `version` on this node (private mount namespace, see the module doc)."""
        self._check_no_doc_address()
        argv = [str(k8s_binary("kubeadm", version)), *args]
        cmd, env = self.ns_command(argv)
        if self.net is None:
            raise AssertionError("kubeadm runs only in a private network namespace (NodeRoot(net=PrivateNet))")
        cmd = self.net.prefix() + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        self.log.append((["kubeadm", *args], r.returncode, r.stdout, r.stderr))
        if check and r.returncode != 0:
            raise RuntimeError(f"[{self.node.name}] kubeadm {' '.join(args)} failed ({r.returncode}):\n"
                               f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        return r

    def apiserver_proc(self, version: str, manifest_text: str, *, keep_bind_address: bool = True,
                       tag: str = "") -> Proc:
        """A kube-apiserver of `version` with the flags of `manifest_text` (kubeadm's manifest) and the
        harness's loopback overrides (KubeadmNode.apiserver_flags: node-local address 127.0.1.1<i> for
        127.0.0.1, the node IP for the documentation-only advertise address, etcd, audit), in this node's
        mount namespace. keep_bind_address=False: no --bind-address at all if the manifest has none
        (what the kubelet would run from such a manifest)."""
        n = self.node
        saved = n.kubeadm_command
        n.kubeadm_command = manifest_command(manifest_text)
        try:
            flags = n.apiserver_flags()
        finally:
            n.kubeadm_command = saved
        if not keep_bind_address and "--bind-address" not in flag_dict(manifest_command(manifest_text)):
            flags = [f for f in flags if not f.startswith("--bind-address=")]
        cmd, env = self.ns_command([str(binary("kube-apiserver", version)), *flags], hostname=n.hostname)
        return Proc(f"apiserver-{n.name}{tag}", cmd, n.workdir / f"kube-apiserver-{version}{tag}.log", env=env)


def dryrun_files(stdout: str) -> dict[str, str]:
    """The files a `kubeadm ... --dry-run` prints ("[dryrun] Would write file "<path>" with content:"
    followed by the file, up to the next "[phase]" line), by path."""
    out: dict[str, str] = {}
    cur, buf = None, []
    # kubeadm prints some messages without a newline ("...to version "v1.36.3"[dryrun] Would write file")
    stdout = re.sub(r'(?<=[^\n])\[dryrun\] Would write file "', '\n[dryrun] Would write file "', stdout)
    for line in stdout.splitlines():
        m = re.match(r'^\[dryrun\] Would write file "([^"]+)" with content:$', line)
        if m or (cur and re.match(r"^\[[a-z][a-z/-]*\] ", line)):
            if cur:
                out[cur] = "\n".join(buf) + "\n"
            cur, buf = (m.group(1), []) if m else (None, [])
            continue
        if cur:
            buf.append(line)
    if cur:
        out[cur] = "\n".join(buf) + "\n"
    return out


def apiserver_summary(manifest_text: str) -> dict:
    """What matters about a kube-apiserver manifest for the node layout."""
    pod = yaml.safe_load(manifest_text)
    c = pod["spec"]["containers"][0]
    flags = flag_dict(c["command"])
    return {"image": c["image"], "bind-address": flags.get("--bind-address"),
            "advertise-address": flags.get("--advertise-address"), "secure-port": flags.get("--secure-port"),
            "probes": {p: (c[p]["httpGet"].get("host"), c[p]["httpGet"]["port"]) for p in
                       ("livenessProbe", "readinessProbe", "startupProbe") if p in c},
            "ports": [(p.get("containerPort"), p.get("hostPort"), p.get("name")) for p in c.get("ports", [])],
            "annotation-endpoint": pod["metadata"].get("annotations", {}).get(
                "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint")}


def listen_addresses(manifest_text: str) -> list[tuple[str, str]]:
    """(address, port) every container of a control-plane manifest listens on (its bind address and
    secure port flags, with the components' defaults)."""
    pod = yaml.safe_load(manifest_text)
    out = []
    for c in pod["spec"]["containers"]:
        flags = flag_dict(c["command"])
        name = c["name"]
        default_port = {"kube-apiserver": "6443", "kube-controller-manager": "10257", "kube-scheduler": "10259"}[name]
        out.append((flags.get("--bind-address", "0.0.0.0"), flags.get("--secure-port", default_port)))
    return out


class KubeletStandIn:
    """What the kubelet of each node would have put into the API (no kubelet runs here): its Node and
    the mirror Pods of its static Pod manifests. Nothing else."""

    def __init__(self, kc: KubeadmCluster):
        self.kc = kc

    def register_node(self, n: KubeadmNode, kubelet_version: str):
        """The Node, and in its status the kubelet's version (kubeadm's version policy reads it). No
        conditions: no kubelet reports Ready or NotReady."""
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": n.name, "labels": {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux",
                                                        "kubernetes.io/arch": "amd64"}}}
        self.kc.apply([node])
        self.kc.kubectl_run(self.kc.direct_kubeconfig(self.kc.first), "patch", "node", n.name, "--subresource=status",
                            "--type=merge", "-p", json.dumps({"status": {"nodeInfo": {"kubeletVersion": kubelet_version}}}))

    def mirror(self, n: KubeadmNode, component: str, manifest_text: str, phase: str | None = None):
        pod = yaml.safe_load(manifest_text)
        h = hashlib.sha256(manifest_text.encode()).hexdigest()[:32]
        md = pod["metadata"]
        md["name"], md["namespace"] = f"{component}-{n.name}", "kube-system"
        md.setdefault("annotations", {}).update({"kubernetes.io/config.hash": h, "kubernetes.io/config.mirror": h,
                                                 "kubernetes.io/config.source": "file"})
        md.pop("creationTimestamp", None)
        pod["spec"]["nodeName"] = n.name
        pod.pop("status", None)
        kc = self.kc.direct_kubeconfig(self.kc.first)
        # the kubelet replaces a changed static Pod's mirror Pod; without a kubelet a graceful delete of a
        # Pod bound to a node never completes, hence --force
        self.kc.kubectl_run(kc, "-n", "kube-system", "delete", "pod", md["name"], "--ignore-not-found",
                            "--grace-period=0", "--force")
        self.kc.kubectl_run(kc, "create", "-f", "-", input=json.dumps(pod))
        if phase:
            self.kc.kubectl_run(kc, "-n", "kube-system", "patch", "pod", md["name"], "--subresource=status",
                                "--type=merge", "-p", json.dumps({"status": {"phase": phase}}))
        return h

    def mirror_all(self, n: KubeadmNode, root: NodeRoot, phase: str | None = None):
        for comp in COMPONENTS:
            self.mirror(n, comp, (root.manifests / f"{comp}.yaml").read_text(), phase)


class StaticPods:
    """The kubelet stand-in's static Pod loop for one node, while a real `kubeadm upgrade apply|node`
    runs: when kubeadm moves a new manifest into /etc/kubernetes/manifests, restart what the manifest
    describes and update its mirror Pod (new config.hash, phase Running), which is what kubeadm waits
    for. kube-apiserver: the running one is stopped and the binary of the manifest's image tag is
    started with the manifest's flags (NodeRoot.apiserver_proc), and the mirror Pod is updated once it
    is ready. kube-controller-manager and kube-scheduler do not run on these nodes: only their mirror
    Pods are updated. The loop runs in the calling thread (`serve_while`), kubeadm in another: the
    processes it starts die with the thread that started them (PDEATHSIG)."""

    def __init__(self, kc: KubeadmCluster, root: NodeRoot):
        self.kc, self.root, self.node = kc, root, root.node
        self.standin = KubeletStandIn(kc)
        self.seen = {c: (root.manifests / f"{c}.yaml").read_text() for c in COMPONENTS}
        self.events: list[tuple[float, str, str]] = []  # (seconds since start, component, image)
        self._t0 = 0.0

    def serve_while(self, fn):
        """fn() (the kubeadm run) in a thread; the static Pod loop here until it returns; its result."""
        out: dict = {}

        def target():
            try:
                out["result"] = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised below
                out["error"] = e
        t = threading.Thread(target=target, daemon=True)
        self._t0 = time.monotonic()
        t.start()
        while t.is_alive():
            self._tick()
            t.join(0.2)
        self._tick()
        if "error" in out:
            raise out["error"]
        return out["result"]

    def _tick(self):
        for comp in COMPONENTS:
            try:
                text = (self.root.manifests / f"{comp}.yaml").read_text()
                yaml.safe_load(text)
            except (FileNotFoundError, yaml.YAMLError):
                continue  # kubeadm is between its two moves
            if text != self.seen[comp]:
                self._apply(comp, text)

    def _apply(self, comp: str, text: str):
        image = yaml.safe_load(text)["spec"]["containers"][0]["image"]
        if comp == "kube-apiserver":
            n = self.node
            version = image.rsplit(":", 1)[1]
            if n.apiserver_proc:
                n.apiserver_proc.stop()
            n.apiserver_proc = self.root.apiserver_proc(version, text, tag="-static-pod").start()
            n.version = version
            n.wait_apiserver(120)
        self.standin.mirror(self.node, comp, text, phase="Running")
        self.seen[comp] = text
        self.events.append((round(time.monotonic() - self._t0, 1), comp, image))


def cluster_config(n: KubeadmNode) -> str:
    """The node's kubeadm configuration (KubeadmNode.kubeadm_config: deploy/kubeadm's bind-address
    extraArgs and patches) as a real node has it: certificatesDir /etc/kubernetes/pki, the CRI socket."""
    docs = [json.loads(d) for d in n.kubeadm_config().split("---\n") if d.strip()]
    for d in docs:
        if d["kind"] == "InitConfiguration":
            d["nodeRegistration"]["criSocket"] = CRI_SOCKET
            d.pop("patches", None)  # (the harness's /patches lives in its --rootfs; not needed for these phases)
        if d["kind"] == "ClusterConfiguration":
            d["certificatesDir"] = "/etc/kubernetes/pki"
    return "---\n".join(yaml.safe_dump(d) for d in docs)


def kubeadm_init_rest(kc: KubeadmCluster, roots: dict[str, NodeRoot], version: str) -> list[str]:
    """What `kubeadm init` / `join --control-plane` of `version` does beyond KubeadmNode.prepare, with
    its own phases where they run without a kubelet: kubelet.conf, the controller-manager and scheduler
    manifests, kubelet-start's files, upload-config (kubeadm-config with deploy/kubeadm's bind-address
    extraArgs, kubelet-config), the addons, mark-control-plane (v1.35.4's; v1.36.3's has no
    --kubeconfig and bootstraps admin.conf through the advertise address, unreachable in PrivateNet). The kubelet's part (Node, mirror Pods) is KubeletStandIn's.
    The init phases that have --kubeconfig get one (admin.conf under another name): with the default
    path kubeadm v1.36.3 bootstraps admin.conf through the advertise address. Returns the kubeadm commands run."""
    standin = KubeletStandIn(kc)
    ran = []

    def run(root, *args):
        root.kubeadm(version, *args)
        ran.append(f"[{root.node.name}] kubeadm {' '.join(args)}")

    cfg_flag = "--config=/etc/kubernetes/kpp-init-config.yaml"
    kc_flag = "--kubeconfig=/etc/kubernetes/kpp-init-admin.conf"
    for i, (name, root) in enumerate(roots.items()):
        n = kc.node(name)
        root.install()
        (root.etc / "kpp-init-config.yaml").write_text(cluster_config(n))
        run(root, "init", "phase", "kubeconfig", "kubelet", cfg_flag, f"--kubeconfig-dir={n.kubeconfig_dir}")
        run(root, "init", "phase", "control-plane", "controller-manager", cfg_flag)
        run(root, "init", "phase", "control-plane", "scheduler", cfg_flag)
        # /var/lib/kubelet/{config.yaml,kubeadm-flags.env,instance-config.yaml}; its `systemctl` calls
        # fail here ("unable to start the kubelet service"), which kubeadm reports as a warning
        run(root, "init", "phase", "kubelet-start", cfg_flag)
        # kubelet.conf names the node's advertise address (192.0.2.1<i>): only its node-IP copy goes
        # into /etc/kubernetes
        root.refresh_kubeconfigs()
        shutil.copy(root.etc / "admin.conf", root.etc / "kpp-init-admin.conf")
        standin.register_node(n, version)
        standin.mirror_all(n, root, phase="Running")
        run(root, "init", "phase", "mark-control-plane", cfg_flag)
        if i == 0:
            run(root, "init", "phase", "upload-config", "kubeadm", cfg_flag, kc_flag)
            run(root, "init", "phase", "upload-config", "kubelet", cfg_flag, kc_flag)
            run(root, "init", "phase", "addon", "all", cfg_flag, kc_flag)
    return ran


def private_net(kc: KubeadmCluster) -> PrivateNet:
    """The namespace kubeadm runs in: lo only, with every node's Envoy (<node-ip>:6443) and etcd."""
    return PrivateNet([(n.node_ip, APISERVER_PORT) for n in kc.nodes.values()] + [("127.0.0.1", kc.etcd.port)])


def main(argv=None):
    import argparse
    import signal
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", required=True)
    p.add_argument("--version", default="v1.35.4")
    a = p.parse_args(argv)
    kc = KubeadmCluster(Path(a.dir), [("cp-1", ""), ("cp-2", "")], version=a.version)
    try:
        kc.start()
        net = private_net(kc).start()
        roots = {name: NodeRoot(n, net) for name, n in kc.nodes.items()}
        for line in kubeadm_init_rest(kc, roots, a.version):
            print(line)
        print(f"up: {kc.timings}", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        kc.stop()


if __name__ == "__main__":
    main()
