"""kubeadm's own upgrade commands on nodes with kube-peer-proxy installed: v1.35.4 -> v1.36.3 with the
real kubeadm v1.36.3 and deploy/kubeadm/upgrade-config.yaml, exactly as docs/deploy.md ("Upgrading
Kubernetes with kube-peer-proxy installed") gives the commands.

Starting point (module fixture): two control-plane nodes set up by the real kubeadm v1.35.4
(kpp.testing.kubeadm_node: certificates, kubeconfigs, the kube-apiserver manifest with deploy/kubeadm's
bind-address and patches; kpp.testing.kubeadm_upgrade.kubeadm_init_rest: kubelet.conf, the controller-manager
and scheduler manifests, kubelet-start's files, `upload-config kubeadm` -- the kubeadm-config ConfigMap
with kubernetesVersion v1.35.4 and apiServer.extraArgs bind-address=127.0.0.1 --, `upload-config
kubelet`, `addon all`), real kube-apiservers v1.35.4 behind each node's Envoy (kpp.render's kubeadm
profile). Every kubeadm command runs in a private mount namespace that gives it the node's
/etc/kubernetes and /var/lib/kubelet, and in a private network namespace with nothing but lo plus
forwarders to the nodes' Envoys and etcd: a dial to any other address fails inside it.

What no kubelet and no container runtime here means, step by step (exact kubeadm v1.36.3 texts):

* `upgrade plan` and `upgrade apply`: the CreateJob health check creates a real Job and waits 60 s for
  it; nothing runs it: `[ERROR CreateJob]: Job "upgrade-health-check-<ms>" in the namespace
  "kube-system" did not complete in 1m0s: no condition of type Complete`. Ignored here
  (--ignore-preflight-errors=CreateJob); with --dry-run the Job is faked and passes.
* `upgrade apply` and `upgrade node` preflight: `[ERROR SystemVerification]: couldn't get kubelet
  version: cannot execute 'kubelet --version': executable file not found in $PATH` and
  `[ERROR ContainerRuntimeVersion]: could not connect to the container runtime: ... dial unix
  /var/run/containerd/containerd.sock: connect: no such file or directory`; without --dry-run also the
  image pull (ImagePull). Ignored here.
* kubelet-start / kubelet-config: `unable to start the kubelet service: [failed to reload systemd:
  exit status 1]` (a warning; kubeadm goes on).
* The kubelet itself: kubeadm waits for it to restart each static Pod (the mirror Pod's config.hash
  changes, then the Pod is Running). kpp.testing.kubeadm_upgrade.StaticPods stands in for exactly that: it
  restarts the kube-apiserver from the manifest kubeadm wrote (the manifest's binary version and flags,
  with the harness's loopback overrides) and updates the mirror Pod; kube-controller-manager and
  kube-scheduler do not run on these nodes (only their mirror Pods are updated).
* kubeadm v1.36.3's `init phase mark-control-plane` has no --kubeconfig and dials the advertise
  address (test_guard_kubeadm_cannot_leave_the_machine); the setup uses v1.35.4's, which does not.

The claims:
1. with upgrade-config.yaml (or --patches), the manifests kubeadm v1.36.3 writes keep the kube-apiserver
   on --bind-address=127.0.0.1 with every probe on 127.0.0.1, its --advertise-address the node's; no
   component binds <node-ip>:6443 (dry-run of apply and node, then the real apply and node);
2. the controls: without the patches the probes go to the advertise address (Envoy's); with the
   bind-address only in a local --config file and not in the ConfigMap, kubeadm writes no
   --bind-address (it warns `Ignored configuration document with GroupVersionKind
   kubeadm.k8s.io/v1beta4, Kind=ClusterConfiguration`), and that kube-apiserver dies on
   `listen tcp 0.0.0.0:6443: bind: address already in use` (Envoy holds <node-ip>:6443);
3. the real `kubeadm upgrade apply v1.36.3` on cp-1, then `kubeadm upgrade node` on cp-2 (before
   `apply`, `upgrade node` still renders v1.35.4: hence the order), renew the serving,
   apiserver-kubelet-client and front-proxy-client certificates in place (not the CAs) and the
   kubeconfigs' certificates, rewrite the ConfigMap to v1.36.3 keeping the bind address, leave the
   addons to the last node; the same Envoy process presents the renewed serving certificate and holds
   the renewed front-proxy client certificate within 10 s of the renewal (EnvoyWatch measures it), and
   the new kube-apiservers v1.36.3 serve through Envoy with admin.conf's renewed certificate, whose
   identity the proxy asserts.
"""

from __future__ import annotations

import json
import re
import ssl
import socket
import threading
import time
import uuid

import pytest
import yaml

from kpp.testing import kubeadm_upgrade as ku
from kpp.testing.cluster import DEFAULT_VERSION, SKEW_OLD_VERSION
from kpp.testing.kubeadm_node import APISERVER_PORT, SNI, KubeadmCluster, kubeconfig_credentials, openssl
from kpp.testing.proc import client_tls, get_json
from kpp.testing.sds import NoKeyRotationFailures
from k8senv import dumped

OLD, NEW = SKEW_OLD_VERSION, DEFAULT_VERSION
CONFIG = f"--config={ku.KPP_DIR}/upgrade-config.yaml"
PATCHES = f"--patches={ku.KPP_DIR}/patches"
# what this machine lacks (see the module doc); nothing else is ignored
NO_KUBELET = "--ignore-preflight-errors=SystemVerification,ContainerRuntimeVersion"
NO_KUBELET_REAL = "--ignore-preflight-errors=SystemVerification,ContainerRuntimeVersion,ImagePull,CreateJob"
MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"

# pytest.ini's 300 s is too short here: `upgrade plan` alone waits 60 s for kubeadm's health-check Job,
# the real `upgrade apply` takes about 70 s, and run alone a test pays the module fixture (13 s) and, for
# test_after_the_upgrade_..., both upgrades (170 s for the whole file unloaded; loaded, two to three times).
pytestmark = pytest.mark.timeout(900)

RUNS: list[tuple[str, str, int, float]] = []  # (node, command, rc, seconds): the closing note
REQUESTS: list[str] = []  # the scheme://host:port of every API request the upgrade commands made
# node IPs 127.0.0.51/52, apiservers 127.0.1.51/52 (kubeadm: 192.0.2.51/52): apart from the other
# kubeadm clusters' addresses, so this module can run next to them
FIRST_INDEX = 41


class Env:
    def __init__(self, kc: KubeadmCluster, net: ku.PrivateNet, roots: dict[str, ku.NodeRoot], setup: list[str]):
        self.kc, self.net, self.roots, self.setup = kc, net, roots, setup
        self.cp1, self.cp2 = kc.node("cp-1"), kc.node("cp-2")
        self.dry: dict[str, tuple] = {}  # "apply-config" / "apply-patches" -> (kubeadm's result, its files)
        self.upgrades: dict[str, str] = {}  # node -> "started" / "done" (test_real_upgrade)

    def kubeadm(self, node: str, *args: str, check: bool = True, timeout: float = 240):
        """kubeadm v1.36.3 on the node, with --v=6 on top of args: client-go then logs every request's
        URL, and every one must be a loopback address."""
        t0 = time.monotonic()
        r = self.roots[node].kubeadm(NEW, *args, "--v=6", check=False, timeout=timeout)
        dt = time.monotonic() - t0
        urls = re.findall(r'url="(https?://[^/"]+)', r.stderr)
        REQUESTS.extend(urls)
        RUNS.append((node, "kubeadm " + " ".join(args), r.returncode, round(dt, 1)))
        print(f"\n[{node}] kubeadm {' '.join(args)}  -> rc {r.returncode} in {dt:.1f}s, {len(urls)} API requests "
              f"to {sorted(set(urls))}")
        for line in r.stderr.splitlines():
            if ("WARNING" in line or "ERROR" in line or line.startswith("error")) and "round_trippers" not in line:
                print(f"    stderr: {line.strip()[:400]}")
        outside = [u for u in urls if not re.match(r"https?://127\.", u)]
        unreachable = [l for l in (r.stdout + r.stderr).splitlines() if "network is unreachable" in l]
        assert not outside and not unreachable, f"kubeadm tried a non-loopback address: {outside[:3]} {unreachable[:3]}"
        if check:
            assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    def cm(self) -> dict:
        kcfg = self.kc.direct_kubeconfig(self.cp1)
        r = self.kc.kubectl_run(kcfg, "-n", "kube-system", "get", "cm", "kubeadm-config", "-o", "json")
        return json.loads(r.stdout)

    def cluster_configuration(self) -> dict:
        return yaml.safe_load(self.cm()["data"]["ClusterConfiguration"])


# The module fixture (kubeadm v1.35.4 on two nodes, real apiservers) is paid by the first test, and kubeadm's
# upgrade apply and upgrade node each get up to 400 s (their own bound): the module takes ~3 min (Makefile),
# past pytest.ini's 300 s default for one test under load.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def env(request, tmp_path_factory):
    t0 = time.monotonic()
    kc = KubeadmCluster(tmp_path_factory.mktemp("kubeadm-upgrade"), [("cp-1", ""), ("cp-2", "")], version=OLD,
                        first_index=FIRST_INDEX)
    net = None
    try:
        kc.start()
        net = ku.private_net(kc).start()
        roots = {name: ku.NodeRoot(n, net) for name, n in kc.nodes.items()}
        setup = ku.kubeadm_init_rest(kc, roots, OLD)
    except BaseException:
        print(kc.dump())
        if net:
            net.stop()
        kc.stop()
        raise
    kc.timings["fixture total"] = round(time.monotonic() - t0, 2)
    print(f"\nkubeadm {OLD} control plane up: {kc.timings}\n" + "\n".join(setup))
    try:
        with dumped(request, kc):
            yield Env(kc, net, roots, setup)
    finally:
        net.stop()
        kc.stop()


def probe_hosts(summary: dict) -> set:
    return {host for host, _ in summary["probes"].values()}


def check_layout(files: dict[str, str], node, version: str = NEW) -> dict:
    """The claims about what kubeadm writes, for one node; returns the kube-apiserver's summary."""
    api = ku.apiserver_summary(files[MANIFEST])
    assert api["image"] == f"registry.k8s.io/kube-apiserver:{version}", api
    assert api["bind-address"] == "127.0.0.1", api
    assert api["advertise-address"] == node.doc_ip, api  # the node's address (here the documentation one)
    assert set(api["probes"]) == {"livenessProbe", "readinessProbe", "startupProbe"}, api
    assert probe_hosts(api) == {"127.0.0.1"}, api
    assert api["ports"] == [(6443, None, "probe-port")], api  # declared for the probes, as in v1.35.4's
    listens = {}
    for path, text in files.items():
        if path.startswith("/etc/kubernetes/manifests/"):
            listens[path.rsplit("/", 1)[1]] = ku.listen_addresses(text)
            for addr, port in ku.listen_addresses(text):
                assert addr.startswith("127."), (path, addr, port)
    kubelet = yaml.safe_load(files.get("/var/lib/kubelet/config.yaml", "{}")) or {}
    assert str(kubelet.get("port", 10250)) != "6443" and str(kubelet.get("healthzPort", 10248)) != "6443", kubelet
    print(f"  kube-apiserver manifest: {api}\n  listeners of the manifests kubeadm writes: {listens}")
    return api


# ---- the starting point ------------------------------------------------------------------------------

def test_starting_point_is_a_kubeadm_v1_35_cluster_behind_envoy(env):
    cc = env.cluster_configuration()
    print(f"kubeadm-config ClusterConfiguration: kubernetesVersion={cc['kubernetesVersion']} "
          f"apiServer.extraArgs={cc['apiServer'].get('extraArgs')} certificatesDir={cc['certificatesDir']}")
    assert cc["kubernetesVersion"] == OLD
    assert {"name": "bind-address", "value": "127.0.0.1"} in cc["apiServer"]["extraArgs"]
    for n in (env.cp1, env.cp2):
        v = n.via("/version").json()["gitVersion"]
        api = ku.apiserver_summary(n.manifest.read_text())
        print(f"{n.name}: through Envoy {n.node_ip}:6443 /version {v}; kubeadm {OLD} manifest {api}")
        assert v == OLD and api["image"].endswith(f":{OLD}") and api["bind-address"] == "127.0.0.1"
        assert probe_hosts(api) == {"127.0.0.1"} and api["ports"] == [(6443, None, "probe-port")], api
    # the guard: inside kubeadm's network namespace only lo exists
    routes = env.net.run(["ip", "-o", "route", "show", "table", "all"]).stdout
    links = env.net.run(["ip", "-o", "link", "show"]).stdout
    print(f"kubeadm's network namespace: links {[l.split(':')[1].strip() for l in links.splitlines()]}")
    assert [l.split(":")[1].strip() for l in links.splitlines()] == ["lo"], links
    assert all(" dev lo " in l for l in routes.splitlines()), routes


# ---- plan and the dry runs -----------------------------------------------------------------------------

def test_upgrade_plan(env):
    r = env.kubeadm("cp-1", "upgrade", "plan", NEW, CONFIG, "--ignore-preflight-errors=CreateJob", timeout=200)
    print(r.stdout)
    assert "CreateJob" in r.stderr and "did not complete in 1m0s" in r.stderr, r.stderr
    assert f"[upgrade/versions] Cluster version: {OLD.lstrip('v')}" in r.stdout or \
        f"[upgrade/versions] Cluster version: {OLD}" in r.stdout, r.stdout
    assert f"kubeadm upgrade apply {NEW}" in r.stdout, r.stdout
    rows = [l.split() for l in r.stdout.splitlines() if l.split()[:2] == ["kube-apiserver", "cp-1"] or
            l.split()[:1] == ["kube-apiserver"]]
    assert any(OLD in row and NEW in row for row in rows), rows


def apply_dry_run(env, how: str):
    """`kubeadm upgrade apply --dry-run` on cp-1 with upgrade-config.yaml ("config") or --patches, once per
    module: (its result, the files it would write)."""
    if f"apply-{how}" not in env.dry:
        r = env.kubeadm("cp-1", "upgrade", "apply", NEW, "--dry-run", CONFIG if how == "config" else PATCHES,
                        NO_KUBELET)
        env.dry[f"apply-{how}"] = (r, ku.dryrun_files(r.stdout))
    return env.dry[f"apply-{how}"]


@pytest.mark.parametrize("how", ["config", "patches"])
def test_upgrade_apply_dry_run_keeps_the_layout(env, how):
    r, files = apply_dry_run(env, how)
    assert "[upgrade/successful] Finished dryrunning successfully!" in r.stdout or "dryrun" in r.stdout.lower()
    assert 'Applied patch of type "application/strategic-merge-patch+json" to target "kube-apiserver"' in r.stdout
    check_layout(files, env.cp1)
    if how == "patches":  # the same manifests as with --config (run here when [config] did not run)
        for path, text in apply_dry_run(env, "config")[1].items():
            if path.startswith("/etc/kubernetes/manifests/"):
                assert files[path] == text, path
    # and nothing was written: the manifest on disk is still v1.35.4's
    assert ku.apiserver_summary(env.cp1.manifest.read_text())["image"].endswith(f":{OLD}")


def test_upgrade_node_dry_run_before_apply_stays_at_the_cluster_version(env):
    """`kubeadm upgrade node` renders the ConfigMap's kubernetesVersion: before `upgrade apply` has run
    on the first node that is still v1.35.4 (hence the order: apply on one node, then node on the others)."""
    r = env.kubeadm("cp-2", "upgrade", "node", "--dry-run", CONFIG, NO_KUBELET)
    assert "[upgrade/successful] Finished dryrunning successfully!" in r.stdout, r.stdout[-2000:]
    check_layout(ku.dryrun_files(r.stdout), env.cp2, version=OLD)


# ---- the controls ----------------------------------------------------------------------------------

def test_control_without_the_patches_the_probes_go_to_envoy(env):
    r = env.kubeadm("cp-1", "upgrade", "apply", NEW, "--dry-run", NO_KUBELET)
    api = ku.apiserver_summary(ku.dryrun_files(r.stdout)[MANIFEST])
    print(f"  without upgrade-config.yaml / --patches: {api}")
    assert 'to target "kube-apiserver"' not in r.stdout
    assert probe_hosts(api) == {env.cp1.doc_ip}, api  # <advertise-address>:6443 is Envoy's
    assert api["bind-address"] == "127.0.0.1", "the bind address comes from the ConfigMap, not from the patches"


def test_control_top_level_patches_in_upgrade_configuration_are_dropped(env):
    """Why upgrade-config.yaml puts the patches under apply: and node: -- the way Init/JoinConfiguration
    carry them (top level) is dropped by an UpgradeConfiguration with only a warning."""
    root = env.roots["cp-1"]
    f = root.etc / "kube-peer-proxy" / "upgrade-config-top-level.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "UpgradeConfiguration",
                                 "patches": {"directory": f"{ku.KPP_DIR}/patches"}}))
    r = env.kubeadm("cp-1", "upgrade", "apply", NEW, "--dry-run", f"--config={ku.KPP_DIR}/{f.name}", NO_KUBELET)
    warn = [l.strip() for l in r.stderr.splitlines() if "unknown field" in l]
    api = ku.apiserver_summary(ku.dryrun_files(r.stdout)[MANIFEST])
    print(f"  top-level patches: {warn}; probes {api['probes']}")
    assert any('unknown field "patches"' in w for w in warn), r.stderr
    assert probe_hosts(api) == {env.cp1.doc_ip}, api


def test_guard_kubeadm_cannot_leave_the_machine(env):
    """The network namespace is a guard, not decoration: kubeadm v1.36.3's `init phase
    mark-control-plane` (no --kubeconfig) bootstraps admin.conf through the advertise address (v1.35.4's,
    used in the setup, talks to admin.conf's server). In kubeadm's namespace a connection to that
    address fails at once (ENETUNREACH) instead of leaving the machine."""
    root, doc = env.roots["cp-1"], env.cp1.doc_ip
    probe = env.net.run(["python3", "-c", f"import socket; socket.create_connection(('{doc}', 6443), 3)"])
    print(f"  connect({doc}:6443) in kubeadm's namespace: {probe.stderr.strip().splitlines()[-1]}")
    assert probe.returncode != 0 and "Network is unreachable" in probe.stderr, probe.stderr
    docs = list(yaml.safe_load_all((root.etc / "kpp-init-config.yaml").read_text()))
    for d in docs:
        if d["kind"] == "InitConfiguration":
            d["timeouts"] = {"kubernetesAPICall": "5s"}  # kubeadm retries for 1 min by default
    (root.etc / "kpp-guard-config.yaml").write_text(yaml.safe_dump_all(docs))
    t0 = time.monotonic()
    r = root.kubeadm(NEW, "init", "phase", "mark-control-plane", "--config=/etc/kubernetes/kpp-guard-config.yaml",
                     "--v=6", check=False, timeout=150)
    dt = time.monotonic() - t0
    out = r.stdout + r.stderr
    tried = [l.strip() for l in out.splitlines() if f"https://{doc}:6443" in l]
    final = [l.strip() for l in out.splitlines() if l.startswith("error:")]
    print(f"  kubeadm {NEW} init phase mark-control-plane: rc {r.returncode} after {dt:.1f}s, "
          f"{len(tried)} log lines naming https://{doc}:6443, e.g. {tried[:1]}; {final}")
    assert r.returncode != 0 and tried, out[-3000:]


def test_control_bind_address_only_in_a_local_file_collides_with_envoy(env, tmp_path):
    """kubeadm upgrade reads ClusterConfiguration from the kubeadm-config ConfigMap only: with the
    bind address removed there and given in a local --config file instead, the manifest has no
    --bind-address, and that kube-apiserver cannot start next to Envoy."""
    kcfg = env.kc.direct_kubeconfig(env.cp1)
    cm = env.cm()
    original = cm["data"]["ClusterConfiguration"]
    cc = yaml.safe_load(original)
    cc["apiServer"]["extraArgs"] = [a for a in cc["apiServer"]["extraArgs"] if a["name"] != "bind-address"]
    cm["data"]["ClusterConfiguration"] = yaml.safe_dump(cc)
    cm["metadata"] = {k: v for k, v in cm["metadata"].items() if k in ("name", "namespace")}
    root = env.roots["cp-2"]
    local = root.etc / "kube-peer-proxy" / "upgrade-config-with-cluster-config.yaml"
    local_cc = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
                "apiServer": {"extraArgs": [{"name": "bind-address", "value": "127.0.0.1"}]}}
    local.write_text((ku.DEPLOY_KUBEADM / "upgrade-config.yaml").read_text() + "---\n" + yaml.safe_dump(local_cc))
    env.kc.kubectl_run(kcfg, "replace", "-f", "-", input=json.dumps(cm))
    try:
        r = env.kubeadm("cp-2", "upgrade", "node", "--dry-run",
                        f"--config={ku.KPP_DIR}/upgrade-config-with-cluster-config.yaml", NO_KUBELET, check=False)
    finally:
        cm["data"]["ClusterConfiguration"] = original
        env.kc.kubectl_run(kcfg, "replace", "-f", "-", input=json.dumps(cm))
    assert {"name": "bind-address", "value": "127.0.0.1"} in env.cluster_configuration()["apiServer"]["extraArgs"]
    print(f"  kubeadm with ClusterConfiguration in the local --config: rc {r.returncode}; "
          f"stderr: {[l for l in r.stderr.splitlines() if l.strip()][:6]}")
    assert r.returncode == 0, r.stderr
    text = ku.dryrun_files(r.stdout)[MANIFEST]
    api = ku.apiserver_summary(text)
    print(f"  ConfigMap without bind-address: {api}")
    assert api["bind-address"] is None and probe_hosts(api) == {"127.0.0.1"}, api
    # what the kubelet would run from it: that kube-apiserver without --bind-address, i.e. 0.0.0.0:6443
    proc = root.apiserver_proc(api["image"].rsplit(":", 1)[1], text, keep_bind_address=False, tag="-control").start()
    try:
        deadline = time.monotonic() + 60
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = proc.alive()
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    bind = [l for l in log.splitlines() if "address already in use" in l]
    print(f"  kube-apiserver {NEW} from that manifest: exited={not alive}; {bind[:1]}")
    assert not alive and bind, log[-2000:]
    assert "0.0.0.0:6443" in bind[0] or "[::]:6443" in bind[0], bind
    for n in (env.cp1, env.cp2):  # Envoy and the nodes are unaffected
        assert n.via("/version").json()["gitVersion"] == OLD


# ---- the real upgrade --------------------------------------------------------------------------------

def serial(path) -> str:
    return openssl("x509", "-in", str(path), "-noout", "-serial").strip().split("=", 1)[1]


def presented_serial(host: str, port: int, ca) -> str:
    ctx = client_tls(ca)
    with socket.create_connection((host, port), timeout=10) as s, ctx.wrap_socket(s, server_hostname=SNI) as t:
        der = t.getpeercert(binary_form=True)
    pem = ssl.DER_cert_to_PEM_cert(der)
    import subprocess
    r = subprocess.run(["openssl", "x509", "-noout", "-serial"], input=pem, capture_output=True, text=True, check=True,
                       timeout=30)
    return r.stdout.strip().split("=", 1)[1]


def embedded_serial(kubeconfig) -> str:
    """Serial of the client certificate embedded in a kubeconfig kubeadm wrote."""
    import base64
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    pem = base64.b64decode(user["client-certificate-data"]).decode()
    import subprocess
    r = subprocess.run(["openssl", "x509", "-noout", "-serial"], input=pem, capture_output=True, text=True, check=True,
                       timeout=30)
    return r.stdout.strip().split("=", 1)[1]


def addon_images(env) -> dict[str, str]:
    kcfg = env.kc.direct_kubeconfig(env.cp1)
    return {what: env.kc.kubectl_run(kcfg, "-n", "kube-system", "get", what, "-o",
                                     "jsonpath={.spec.template.spec.containers[0].image}").stdout
            for what in ("deployment/coredns", "daemonset/kube-proxy")}


def norm(serial_hex: str) -> str:
    return serial_hex.lower().lstrip("0")


def envoy_serials(n) -> set[str]:
    """Serial numbers of every certificate chain Envoy's admin /certs lists (listeners and clusters)."""
    doc = get_json(f"http://127.0.0.1:{n.admin_port}/certs", timeout=5)
    return {norm(c["serial_number"]) for cert in doc.get("certificates", []) for c in cert.get("cert_chain", [])}


WATCHES: list["EnvoyWatch"] = []  # running ones, cancelled after each test (_cancel_watches)


@pytest.fixture(autouse=True)
def _cancel_watches():
    """A test that fails before its EnvoyWatch.stop() leaves no thread polling (and forking openssl)."""
    yield
    while WATCHES:
        WATCHES.pop().cancel()


class EnvoyWatch:
    """While kubeadm runs: the first moment this node's Envoy presents a serving certificate, and lists a
    front-proxy client certificate in admin /certs, that is the one on disk and not the one before."""
    INTERVAL = 0.2

    def __init__(self, n, before: dict):
        self.n, self.before = n, before
        self.seen: dict[str, float] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self):
        self.thread.start()
        WATCHES.append(self)
        return self

    def stop(self):
        deadline = time.monotonic() + 15  # the bound is 10 s after the renewal
        while len(self.seen) < 2 and time.monotonic() < deadline:
            time.sleep(self.INTERVAL)
        self.cancel()

    def cancel(self):
        self._stop.set()
        self.thread.join(10)

    def _loop(self):
        n = self.n
        while not self._stop.wait(self.INTERVAL):
            try:
                for what, f in (("serving", "apiserver.crt"), ("front-proxy-client", "front-proxy-client.crt")):
                    if what in self.seen:
                        continue
                    disk = serial(n.pki / f)
                    if disk == self.before[f]:
                        continue
                    if what == "serving":
                        ok = presented_serial(n.node_ip, APISERVER_PORT, n.pki / "ca.crt") == disk
                    else:
                        ok = norm(disk) in envoy_serials(n)
                    if ok:
                        self.seen[what] = time.time()
            except Exception as e:  # noqa: BLE001 - mid-write files, a restarting apiserver: try again
                self.errors.append(f"{type(e).__name__}: {e}")


PKI_FILES = ("apiserver.crt", "apiserver-kubelet-client.crt", "front-proxy-client.crt", "ca.crt", "front-proxy-ca.crt")


def upgraded(env, node: str):
    """`node` has been upgraded by test_real_upgrade (which runs here, checks and all, when its test did
    not run: this test alone, or -k); a failed earlier attempt is not repeated."""
    state = env.upgrades.get(node)
    if state == "done":
        return
    assert state is None, f"{node}'s upgrade failed earlier (test_real_upgrade[{node}])"
    print(f"\n(setting up: test_real_upgrade[{node}] first)")
    test_real_upgrade(env, node)


@pytest.mark.parametrize("node", ["cp-1", "cp-2"])
def test_real_upgrade(env, node):
    """cp-1: `kubeadm upgrade apply v1.36.3`, then cp-2: `kubeadm upgrade node` (the order docs/deploy.md
    gives), each with upgrade-config.yaml and the kubelet stand-in."""
    if node == "cp-2":
        upgraded(env, "cp-1")  # apply before node
    assert node not in env.upgrades, f"{node} upgraded twice"
    env.upgrades[node] = "started"
    n, root = env.kc.node(node), env.roots[node]
    envoy_pid = {node: n.envoy.process.pid}
    before = {f: serial(n.pki / f) for f in PKI_FILES}
    kubelet_conf_before = yaml.safe_load((root.etc / "kubelet.conf").read_text())["clusters"][0]["cluster"]["server"]
    kubeconfig_certs = ("admin", "super-admin", "controller-manager", "scheduler")
    kc_before = {w: embedded_serial(root.etc / f"{w}.conf") for w in kubeconfig_certs}
    pods = ku.StaticPods(env.kc, root)
    # docs/deploy.md: kubeadm's renewals are normal ones; sds.<secret>.key_rotation_failed stays 0 (H-pki)
    rotations = NoKeyRotationFailures([env.cp1.envoy, env.cp2.envoy])
    watch = EnvoyWatch(n, before).start()
    if node == "cp-1":
        r = pods.serve_while(lambda: env.kubeadm(node, "upgrade", "apply", NEW, CONFIG, NO_KUBELET_REAL, "--yes",
                                                 timeout=400))
        assert f'[upgrade] SUCCESS! A control plane node of your cluster was upgraded to "{NEW}".' in r.stdout, \
            r.stdout[-3000:]
    else:
        d = env.kubeadm(node, "upgrade", "node", "--dry-run", CONFIG, NO_KUBELET)
        assert "[upgrade/successful] Finished dryrunning successfully!" in d.stdout, d.stdout[-2000:]
        check_layout(ku.dryrun_files(d.stdout), n)
        r = pods.serve_while(lambda: env.kubeadm(node, "upgrade", "node", CONFIG, NO_KUBELET_REAL, timeout=400))
        assert "[upgrade] The control plane instance for this node was successfully upgraded!" in r.stdout or \
            "successfully upgraded" in r.stdout, r.stdout[-3000:]
    print("\n".join(l for l in r.stdout.splitlines() if l.startswith(("[upgrade/staticpods]", "[upgrade/control-plane]",
                                                                        "[upgrade/kubeconfig]", "[upgrade]",
                                                                        "[upgrade/successful]", "[upload-config]",
                                                                        "[upgrade/addon]"))))
    print(f"  kubelet stand-in restarted: {pods.events}")
    assert [c for _, c, _ in pods.events] == list(ku.COMPONENTS), pods.events
    api = check_layout({MANIFEST: n.manifest.read_text(),
                        **{f"/etc/kubernetes/manifests/{c}.yaml": (root.manifests / f"{c}.yaml").read_text()
                           for c in ku.COMPONENTS[1:]},
                        "/var/lib/kubelet/config.yaml": (root.varlib / "config.yaml").read_text()}, n)
    assert api["image"].endswith(NEW)
    after = {f: serial(n.pki / f) for f in PKI_FILES}
    renewed = sorted(f for f in PKI_FILES if before[f] != after[f])
    print(f"  certificates renewed in place by kubeadm: {renewed}")
    assert renewed == ["apiserver-kubelet-client.crt", "apiserver.crt", "front-proxy-client.crt"], (before, after)
    # the new kube-apiserver presents the renewed serving certificate
    assert presented_serial(n.apiserver_ip, APISERVER_PORT, n.pki / "ca.crt") == after["apiserver.crt"]
    # and so does the same Envoy process (file-based SDS + the pki-reload mirror, docs/deploy.md
    # "Certificate renewal"), whose clusters now hold the renewed front-proxy client certificate
    watch.stop()
    lag = {what: round(watch.seen[what] - (n.pki / f).stat().st_mtime, 1) if what in watch.seen else None
           for what, f in (("serving", "apiserver.crt"), ("front-proxy-client", "front-proxy-client.crt"))}
    print(f"  {n.name}'s Envoy (pid {envoy_pid[node]}, not restarted): renewed serving certificate presented on "
          f"{n.node_ip}:6443 and renewed front-proxy client certificate in /certs, seconds after kubeadm wrote "
          f"them: {lag} (polled every {EnvoyWatch.INTERVAL}s while kubeadm ran)")
    assert all(v is not None and v <= 10 for v in lag.values()), (lag, watch.errors[-3:])
    print(f"  key_rotation_failed after kubeadm's renewals: {rotations.check(f'kubeadm upgrade on {node}')}")
    assert n.envoy.process.pid == envoy_pid[node] and n.envoy.process.poll() is None
    # kubeadm's rewrites of kubeconfigs: only kubelet.conf's server may change (to the advertise address,
    # on a real node <node-ip>:6443, Envoy's)
    doc = root.doc_address_kubeconfigs()
    kubelet_conf_after = yaml.safe_load((root.etc / "kubelet.conf").read_text())["clusters"][0]["cluster"]["server"]
    print(f"  kubelet.conf server {kubelet_conf_before} -> {kubelet_conf_after}; naming the advertise address: {doc}")
    assert set(doc) <= {"kubelet.conf"}, doc
    if node == "cp-1":  # its kubelet.conf named controlPlaneEndpoint, which is this node's own address
        assert (kubelet_conf_before, kubelet_conf_after) == (f"https://{n.node_ip}:6443", f"https://{n.doc_ip}:6443")
    kc_after = {w: embedded_serial(root.etc / f"{w}.conf") for w in kubeconfig_certs}
    print(f"  kubeconfigs whose certificate kubeadm renewed: {sorted(w for w in kc_before if kc_before[w] != kc_after[w])}")
    assert all(kc_before[w] != kc_after[w] for w in kubeconfig_certs), (kc_before, kc_after)
    root.loopback_kubeconfigs()
    assert n.via("/version").json()["gitVersion"] == NEW
    if node == "cp-1":
        cc = env.cluster_configuration()
        print(f"  kubeadm-config after apply: kubernetesVersion={cc['kubernetesVersion']} "
              f"extraArgs={cc['apiServer']['extraArgs']}")
        assert cc["kubernetesVersion"] == NEW
        assert {"name": "bind-address", "value": "127.0.0.1"} in cc["apiServer"]["extraArgs"]
    addons = [l for l in r.stdout.splitlines() if l.startswith("[upgrade/addon]")]
    images = addon_images(env)
    print(f"  addons: {addons}; images {images}")
    if node == "cp-1":  # kubeadm leaves the addons to the last control-plane node
        assert any("Skipping upgrade of addons because control plane instances [cp-2] have not been upgraded" in l
                   for l in addons), addons
        assert images["daemonset/kube-proxy"].endswith(f":{OLD}"), images
    else:
        assert images["daemonset/kube-proxy"].endswith(f":{NEW}"), images
    env.upgrades[node] = "done"


def test_after_the_upgrade_both_nodes_serve_v1_36_through_envoy(env):
    upgraded(env, "cp-2")  # (and so cp-1 before it)
    creds = kubeconfig_credentials(env.roots["cp-1"].etc / "admin.conf", env.kc.workdir / "creds-after")
    for n in (env.cp1, env.cp2):
        assert n.via("/version").json()["gitVersion"] == NEW
        # a client certificate (admin.conf, renewed by upgrade apply): the proxy asserts its identity
        aid = str(uuid.uuid4())
        r = n.via("/api/v1/namespaces/kube-system/configmaps/kubeadm-config", cert=creds[0], key=creds[1],
                  headers={"Audit-ID": aid})
        ev = n.audit_event(aid)
        print(f"  {n.name}: GET kubeadm-config through Envoy with admin.conf's renewed certificate: HTTP {r.status}, "
              f"audited as {ev['user']['username']} {ev['user'].get('groups')}")
        assert r.status == 200 and ev["user"]["username"] == "kubernetes-admin", ev["user"]
        assert "kubeadm:cluster-admins" in ev["user"]["groups"]


def test_zz_closing_note(env):
    if not REQUESTS:  # run alone: one upgrade command to account for
        apply_dry_run(env, "config")
    print(f"\nkubeadm runs (v1.36.3 unless noted), forwarded connections into kubeadm's namespace {env.net.connections}:")
    for line in env.setup:
        print(f"  setup ({OLD}): {line}")
    for node, cmd, rc, dt in RUNS:
        print(f"  [{node}] {cmd}  -> rc {rc}, {dt}s")
    print(f"{len(REQUESTS)} API requests by the upgrade commands, to {sorted(set(REQUESTS))}")
    assert REQUESTS and all(re.match(r"https://127\.0\.0\.5[12]:6443$", u) for u in REQUESTS), set(REQUESTS)
