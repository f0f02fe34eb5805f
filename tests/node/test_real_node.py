"""Real control-plane nodes (kpp.testing.node): the real kubelet and containerd run kube-peer-proxy's
static pod next to the control plane that the real kubeadm sets up, upgrades and renews.

The steps run in order on one cluster (each needs the one before): kubeadm init of cp-1 (v1.35.4) and the
proxy installed as docs/deploy.md "Install" says; cp-2 joined the same way (the image-volume variant of the
manifest: the .wasm from the release's OCI image); kubeadm upgrade to v1.36.3 under a client load through
the load balancer; `kubeadm certs renew all`; a roll of the proxy's own manifest under load; Envoy killed
inside its pod; and kubeadm's upgrade without our `--config`, which must show in the kubelet-probe metric.
`make test-node` runs it (about 10 min) and writes the numbers to target/node/results.json.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kpp import render
from kpp.testing import node as N
from kpp.testing import proc
from kpp.testing.proc import wait_for

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "target" / "node" / "results.json"
NEW_ONLY = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"  # served from v1.36 only
NAMESPACE = "kpp-load"
PROBE_STAT = f"vhost.apiserver.vcluster.{render.KUBELET_PROBE_VCLUSTER}.upstream_rq_total"
results: dict = {}
# kubeadm's upgrade preflight: SystemVerification on cgroup v1 (see test_1), and its two CoreDNS checks,
# which fail when CoreDNS is disabled (dns.disabled: "start version '' not supported"; v1.36.3)
UPGRADE_IGNORE = "--ignore-preflight-errors=SystemVerification,CoreDNSUnsupportedPlugins,CoreDNSMigration"


def log(msg: str):
    print(f"[node {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def kc(tmp_path_factory):
    c = N.NodeCluster(tmp_path_factory.mktemp("node"))
    try:
        c.start()
        yield c
    finally:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1, default=str) + "\n")
        c.stop()


def proxy_pod(n: N.Node) -> str:
    return f"kube-peer-proxy-{n.name}"


def container(kc, n: N.Node, name: str = "envoy") -> dict:
    return next(s for s in kc.pod(proxy_pod(n))["status"]["containerStatuses"] if s["name"] == name)


def wait_proxy_ready(kc, n: N.Node, timeout: float = 120):
    wait_for(lambda: kc.pod_ready(proxy_pod(n)), timeout, f"{n.name}: the proxy's pod Ready")
    wait_for(lambda: (kc.envoy_stat(n, "kube_peer_proxy_snapshot_generation") or 0) >= 1, 30,
             f"{n.name}: a discovery snapshot")


def served_serial(addr: str) -> str:
    """The serial of the certificate served at addr (SNI kubernetes.default.svc)."""
    r = subprocess.run(["openssl", "s_client", "-connect", addr, "-servername", render.KUBEADM_SNI],
                       input="", capture_output=True, text=True, timeout=10)
    x = subprocess.run(["openssl", "x509", "-noout", "-serial"], input=r.stdout, capture_output=True, text=True)
    return x.stdout.strip()


def file_serial(path: Path) -> str:
    return subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", str(path)], capture_output=True,
                          text=True, check=True).stdout.strip()


class Load:
    """kpp.testing.lbclient through the load balancer, as kubernetes-admin, until stop()."""

    def __init__(self, kc, name: str):
        ca, cert, key = kc.client_cert()
        self.out = kc.workdir / f"load-{name}.json"
        self.stop_file = kc.workdir / f"load-{name}.stop"
        cfg = {"lb": [N.GATEWAY, 6443], "kubectl_lb": [N.GATEWAY, 6443], "ca": str(ca), "cert": str(cert),
               "key": str(key), "sni": render.KUBEADM_SNI, "duration": 1800, "workers": 4, "rate": 40,
               "kubectl_interval": 0.5, "watchers": 2, "namespace": NAMESPACE, "peer_only": NEW_ONLY,
               "common": "/api/v1/namespaces/default/configmaps?limit=1", "run": name, "stop_file": str(self.stop_file)}
        self.p = subprocess.Popen([sys.executable, "-m", "kpp.testing.lbclient", "--config", json.dumps(cfg),
                                   "--out", str(self.out)], stdout=subprocess.PIPE, text=True,
                                  preexec_fn=proc.die_with_parent(signal.SIGKILL))
        line = proc.read_line(self.p.stdout, 60, "kpp.testing.lbclient")
        assert line.startswith("START "), line
        self.t0 = float(line.split()[1])

    def stop(self) -> dict:
        self.stop_file.touch()
        rc = self.p.wait(timeout=120)
        assert rc == 0, f"the clients exited with {rc}"
        return json.loads(self.out.read_text())


def judge(result: dict) -> dict:
    """False 404s (NEW_ONLY answered 404 after it had been answered 200: some server served it), failed
    requests (anything else not the expected answer; a 404 for NEW_ONLY before any server serves it is
    genuine), and the longest client wait of a successful call, retries included."""
    calls = [r for r in result["records"] if r[0] != "watch"]
    first_200 = min((r[4] for r in calls if r[2] == NEW_ONLY and r[5] == 200), default=None)
    false_404 = [r for r in calls if r[2] == NEW_ONLY and r[5] == 404 and first_200 is not None and r[3] > first_200]
    failed = []
    for r in calls:
        ok = {"POST": 201}.get(r[1], 200)
        if r[5] == ok or (r[2] == NEW_ONLY and r[5] == 404 and r not in false_404):
            continue
        failed.append(r)
    good = [r for r in calls if r not in failed]
    longest = max((r[4] - r[3] for r in good), default=0.0)
    return {"requests": len(calls), "false_404": len(false_404), "failed": len(failed),
            "failed_examples": failed[:5], "longest_gap_s": round(longest, 3),
            "retried": sum(1 for r in calls if r[6] > 0), "watch_streams": sum(len(w["streams"]) for w in result["watches"])}


# ---- 1. kubeadm init, the proxy installed as docs/deploy.md says ------------------------------------

def test_1_init_and_install(kc):
    n = kc.nodes["cp-1"]
    kc.push_version(N.OLD)
    n.start().start_containerd()
    n.start_kubelet(N.OLD)
    docs = N.kubeadm_docs(n, N.OLD, kc.etcd_url)
    (n.etc / "kubeadm-config.yaml").write_text(N.dump_yaml(docs))
    t = time.monotonic()
    # SystemVerification: kubeadm itself asks for it to be skipped on cgroup v1 ("You must also
    # explicitly skip this validation"), after failCgroupV1: false
    kc.kubeadm(n, N.OLD, "init", "--config", "/etc/kubernetes/kubeadm-config.yaml",
               "--ignore-preflight-errors=SystemVerification")
    results["init_s"] = round(time.monotonic() - t, 1)
    wait_for(lambda: kc.kubectl("get", "node", n.name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                                check=False).stdout == "True", 120, "cp-1 Ready")

    # Install, step by step (docs/deploy.md): 1-2 the .wasm and the bootstrap, 3 RBAC, 4 the kubeadm
    # configuration (ConfigMap and the node's file), the apiserver manifest regenerated, then the proxy's.
    manifest = kc.install_files(n, "hostpath")
    kc.kubectl("apply", "-f", str(ROOT / "deploy/rbac.yaml"))
    cm = json.loads(kc.kubectl("-n", "kube-system", "get", "cm", "kubeadm-config", "-o", "json").stdout)
    cluster = yaml.safe_load(cm["data"]["ClusterConfiguration"])
    cluster.setdefault("apiServer", {})["extraArgs"] = [{"name": "bind-address", "value": "127.0.0.1"}]
    cm["data"]["ClusterConfiguration"] = yaml.safe_dump(cluster)
    kc.kubectl("replace", "-f", "-", input=json.dumps(cm))
    for d in docs:
        if d["kind"] == "InitConfiguration":
            d["patches"] = {"directory": f"{N.KPP_DIR}/patches"}
        if d["kind"] == "ClusterConfiguration":
            d["apiServer"] = {"extraArgs": [{"name": "bind-address", "value": "127.0.0.1"}]}
    (n.etc / "kubeadm-config.yaml").write_text(N.dump_yaml(docs))
    t = time.monotonic()
    kc.kubeadm(n, N.OLD, "init", "phase", "control-plane", "apiserver", "--config", "/etc/kubernetes/kubeadm-config.yaml")
    kc.place_manifest(n, manifest)
    wait_proxy_ready(kc, n, 180)
    results["install_to_ready_s"] = round(time.monotonic() - t, 1)

    text = (n.manifests / "kube-apiserver.yaml").read_text()
    assert "--bind-address=127.0.0.1" in text
    assert text.count("host: 127.0.0.1") == 3, "the three probes ask 127.0.0.1"
    # kubectl through the load balancer and through the node's Envoy
    for server in (None, f"{n.ip}:6443"):
        assert kc.kubectl("get", "--raw", "/readyz", server=server).stdout == "ok"
        assert n.name in kc.kubectl("get", "nodes", server=server).stdout
    # the kubelet ran the manifest's own entrypoint: bash, with Envoy as its child
    ps = n.exec(["ps", "-eo", "pid,ppid,args"]).stdout
    envoy = [l for l in ps.splitlines() if re.search(r"\benvoy --config-path /etc/kubernetes/kube-peer-proxy/envoy.yaml", l)]
    assert len(envoy) == 1, ps
    ppid = envoy[0].split()[1]
    argv = n.exec(["cat", f"/proc/{ppid}/cmdline"]).stdout.split("\0")
    script = [c for c in yaml.safe_load((ROOT / "deploy/static-pod.yaml").read_text())["spec"]["containers"] if c["name"] == "envoy"][0]["command"]
    assert argv[:len(script)] == script and script[-1] == "kube-peer-proxy", argv[:2]
    parent = " ".join(argv[:2]) + " <the manifest's script> kube-peer-proxy"
    # the image's userland, as the static pod's comments say: bash, no curl
    cid = container(kc, n)["containerID"].split("//")[1]
    ctr = [str(N.node_tool("containerd").parent / "ctr"), "--address", "/run/containerd/containerd.sock", "-n", "k8s.io"]
    r = n.exec([*ctr, "tasks", "exec", "--exec-id", "kpp-check", cid, "/bin/bash", "-c",
                "command -v curl || echo no-curl; command -v cksum grep sed mv sleep date; echo $BASH_VERSION"])
    assert "no-curl" in r.stdout and "/usr/bin/cksum" in r.stdout, r.stdout
    results["step1"] = {"kubelet": N.OLD, "proxy_pod": "Ready", "envoy_parent": parent}


# ---- 2. a second control-plane node, the image-volume variant -----------------------------------------

def test_2_join_second_node(kc):
    first, n = kc.nodes["cp-1"], kc.nodes["cp-2"]
    dist = ROOT / "dist"
    digest = (dist / "oci-digests.txt").read_text().split()[0]
    version = (dist / "oci-digests.txt").read_text().split()[1].rsplit(":", 1)[1]
    ref = kc.images.wasm(dist / "oci", version)
    wasm_ref = f"{ref}@{digest}"
    key = kc.kubeadm(first, N.OLD, "init", "phase", "upload-certs", "--upload-certs",
                     "--config", "/etc/kubernetes/kubeadm-config.yaml").stdout.strip().splitlines()[-1]
    join = kc.kubeadm(first, N.OLD, "token", "create", "--print-join-command").stdout.split()
    token, cahash = join[join.index("--token") + 1], join[join.index("--discovery-token-ca-cert-hash") + 1]
    n.start().start_containerd()
    n.start_kubelet(N.OLD)
    (n.etc / "kubeadm-join.yaml").write_text(N.dump_yaml([{
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": {"apiServerEndpoint": f"{N.GATEWAY}:6443", "token": token,
                                         "caCertHashes": [cahash]}},
        "controlPlane": {"localAPIEndpoint": {"advertiseAddress": n.ip, "bindPort": 6443}, "certificateKey": key},
        "nodeRegistration": {"name": n.name, "criSocket": N.CRI_SOCKET,
                             "kubeletExtraArgs": [{"name": "node-ip", "value": n.ip}]},
        "patches": {"directory": f"{N.KPP_DIR}/patches"}}]))
    cfg = "--config=/etc/kubernetes/kubeadm-join.yaml"
    # The kubelet of a joining control-plane node talks to its own <node-ip>:6443 (kubeadm's
    # ControlPlaneKubeletLocalMode, GA and locked on in v1.35), which is Envoy's: the proxy's pod must be
    # there before the kubelet-start phase. Preflight wants /etc/kubernetes/manifests empty, and Envoy
    # needs the PKI, so: preflight, the control-plane files, the proxy, then the rest of the join.
    # (the patches must be in place before control-plane-prepare renders the apiserver manifest)
    (n.etc / "kube-peer-proxy").mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "deploy/kubeadm/patches", n.etc / "kube-peer-proxy/patches", dirs_exist_ok=True)
    kc.kubeadm(n, N.OLD, "join", "phase", "preflight", cfg, "--ignore-preflight-errors=SystemVerification")
    kc.kubeadm(n, N.OLD, "join", "phase", "control-plane-prepare", "all", cfg)
    manifest = kc.install_files(n, "image-volume", wasm_ref)
    kc.place_manifest(n, manifest)
    t = time.monotonic()
    kc.kubeadm(n, N.OLD, "join", cfg, "--skip-phases=preflight,control-plane-prepare")
    wait_proxy_ready(kc, n, 180)
    # kubeadm's upgrade preflight wants every control-plane Node Ready (ControlPlaneNodesReady)
    wait_for(lambda: kc.kubectl("get", "node", n.name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                                check=False).stdout == "True", 120, "cp-2 Ready")
    results["join_to_ready_s"] = round(time.monotonic() - t, 1)
    pod = kc.pod(proxy_pod(n))
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["wasm"]["image"]["reference"] == wasm_ref
    # both nodes' Envoys know both members; kubectl through each node's Envoy
    for m in kc.nodes.values():
        wait_for(lambda: sorted(v for v in kc.envoy_stats(m, r"^(wasmcustom\.)?kube_peer_proxy_server_fresh").values()) == [1, 1],
                 60, f"{m.name}: two fresh members")
        assert kc.kubectl("get", "--raw", "/readyz", server=f"{m.ip}:6443").stdout == "ok"
    results["step2"] = {"wasm_image": wasm_ref, "nodes": kc.kubectl("get", "nodes", "-o", "wide").stdout}


# ---- 3. kubeadm upgrade under load ---------------------------------------------------------------------

def test_3_upgrade_under_load(kc):
    kc.push_version(N.NEW)
    kc.kubectl("create", "namespace", NAMESPACE, check=False)
    before = {n.name: (container(kc, n)["containerID"], kc.pod(proxy_pod(n))["metadata"]["uid"]) for n in kc.nodes.values()}
    manifests = {n.name: (n.manifests / "kube-peer-proxy.yaml").read_bytes() for n in kc.nodes.values()}
    logs = {n.name: LogCapture(n.workdir / "var-log/pods", f"kube-system_{proxy_pod(n)}_*/envoy/*.log")
            for n in kc.nodes.values()}
    load = Load(kc, "upgrade")
    events = {}
    try:
        first, second = kc.nodes["cp-1"], kc.nodes["cp-2"]
        cfg = f"--config={N.KPP_DIR}/upgrade-config.yaml"
        t = time.monotonic()
        kc.kubeadm(first, N.NEW, "upgrade", "apply", N.NEW, cfg, "--yes", UPGRADE_IGNORE, timeout=900)
        events["apply_s"] = round(time.monotonic() - t, 1)
        first.kubelet.restart(N.NEW)   # the guide's kubelet upgrade: new package, `systemctl restart kubelet`
        t = time.monotonic()
        kc.kubeadm(second, N.NEW, "upgrade", "node", cfg, UPGRADE_IGNORE, timeout=900)
        events["node_s"] = round(time.monotonic() - t, 1)
        second.kubelet.restart(N.NEW)
        for n in kc.nodes.values():
            wait_for(lambda: kc.kubectl("get", "node", n.name, "-o", "jsonpath={.status.nodeInfo.kubeletVersion}").stdout
                     == N.NEW, 120, f"{n.name}: kubelet {N.NEW}")
        time.sleep(5)
    finally:
        verdict = judge(load.stop())
        text = {name: c.stop() for name, c in logs.items()}
    verdict.update(events)
    results["step3_upgrade"] = verdict
    log(f"upgrade under load: {verdict}")
    for n in kc.nodes.values():
        assert N.NEW in (n.manifests / "kube-apiserver.yaml").read_text()
        # The proxy's pod keeps its layout: kubeadm leaves its manifest alone, and the pod runs it.
        assert (n.manifests / "kube-peer-proxy.yaml").read_bytes() == manifests[n.name], f"{n.name}: manifest changed"
        pod = kc.pod(proxy_pod(n))
        assert [c["name"] for c in pod["spec"]["containers"]] == ["envoy", "pki-reload"]
        assert pod["spec"]["hostNetwork"] is True
        c = container(kc, n)
        recreated = pod["metadata"]["uid"] != before[n.name][1]
        results.setdefault("step3_proxy_pod", {})[n.name] = {
            "recreated_by_kubelet_upgrade": recreated, "restartCount": c["restartCount"],
            "handover_log": [l for l in text[n.name].splitlines() if "previous" in l or "is free after" in l][-3:]}
        if recreated:
            # The new kubelet re-created the static pod (its spec hash changed): the new pod's Envoy waits
            # for the old one, still draining, to exit (the handover log), and starts once, no restart.
            assert c["restartCount"] == 0, f"{n.name}: the new pod's Envoy restarted: {c}"
        else:
            assert c["containerID"] == before[n.name][0], f"{n.name}: the proxy restarted"
        assert (kc.envoy_stat(n, PROBE_STAT) or 0) == 0, f"{n.name}: kubelet probes through Envoy"
    assert verdict["false_404"] == 0 and verdict["failed"] == 0, verdict


# ---- 4. certificate renewal -----------------------------------------------------------------------------

def test_4_certs_renew(kc):
    n = kc.nodes["cp-1"]
    before = container(kc, n)
    old = served_serial(f"{n.ip}:6443")
    kc.kubeadm(n, N.NEW, "certs", "renew", "all")
    t = time.monotonic()
    new = file_serial(n.etc / "pki/apiserver.crt")
    assert new != old
    wait_for(lambda: served_serial(f"{n.ip}:6443") == new, 30, "the renewed certificate served by Envoy")
    results["step4_reload_s"] = round(time.monotonic() - t, 2)
    after = container(kc, n)
    assert (after["restartCount"], after["containerID"]) == (before["restartCount"], before["containerID"])
    assert kc.kubectl("get", "--raw", "/readyz", server=f"{n.ip}:6443").stdout == "ok"


# ---- 5. rolling the proxy itself ------------------------------------------------------------------------

def test_5_roll_the_proxy(kc):
    n = kc.nodes["cp-2"]
    old = container(kc, n)
    old_uid = kc.pod(proxy_pod(n))["metadata"]["uid"]
    path = n.manifests / "kube-peer-proxy.yaml"
    pod = yaml.safe_load(path.read_text())
    pod["metadata"].setdefault("annotations", {})["kube-peer-proxy.example/rollout"] = "2"  # a new manifest
    # The kubelet deletes a removed pod's log directory: its lines are kept while they are written.
    logs = LogCapture(n.workdir / "var-log/pods", f"kube-system_{proxy_pod(n)}_*/envoy/*.log")
    load = Load(kc, "roll")
    try:
        time.sleep(5)
        t = time.monotonic()
        kc.place_manifest(n, yaml.safe_dump(pod, sort_keys=False))
        wait_for(lambda: kc.pod(proxy_pod(n))["metadata"]["uid"] != old_uid and kc.pod_ready(proxy_pod(n)), 180,
                 "the new proxy pod Ready")
        results["step5_roll_s"] = round(time.monotonic() - t, 1)
        time.sleep(8)
    finally:
        verdict = judge(load.stop())
        text = logs.stop()
    results["step5_roll"] = verdict
    drain = [line for line in text.splitlines() if "kube-peer-proxy: " in line]
    results["step5_drain_log"] = drain[-6:]
    log(f"roll under load: {verdict}; drain log: {drain[-6:]}")
    assert "SIGTERM: failing health checks" in text and "stopping Envoy" in text, "the drain ran"
    assert container(kc, n)["containerID"] != old["containerID"]
    assert verdict["failed"] == 0 and verdict["false_404"] == 0, verdict


class LogCapture:
    """Every line written to the files matching `pattern` under `root` until stop(), kept even after the
    kubelet deletes them (a removed pod's logs go with it)."""

    def __init__(self, root: Path, pattern: str):
        import threading
        self.root, self.pattern, self.seen = root, pattern, {}
        self.done = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.done.is_set():
            for f in self.root.glob(self.pattern):
                try:
                    self.seen[str(f)] = f.read_text(errors="replace")
                except OSError:
                    pass
            self.done.wait(0.2)

    def stop(self) -> str:
        self.done.set()
        self.t.join(5)
        return "\n".join(self.seen.values())


# ---- 6. Envoy killed inside its pod ------------------------------------------------------------------------

def readyz(kc, n: N.Node) -> int:
    """What the load balancer's check gets from the node's Envoy: /readyz on <node-ip>:6443 (0: no answer)."""
    import http.client
    import ssl
    ca, cert, key = kc.client_cert()
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    try:
        c = http.client.HTTPSConnection(n.ip, 6443, context=ctx, timeout=3)  # as kubectl --server <ip>:6443
        c.request("GET", "/readyz")
        status = c.getresponse().status
        c.close()
        return status
    except OSError:
        return 0


def test_6_envoy_killed(kc):
    """Judged from what the load balancer and the runtime see: while the node's Envoy is down its kubelet
    cannot reach any API server (it talks to <node-ip>:6443 only), so the pod's status in the API is stale
    until the new Envoy listens."""
    n = kc.nodes["cp-1"]
    before = container(kc, n)["restartCount"]
    pid = n.exec(["pgrep", "-f", "^envoy --config-path"]).stdout.split()[0]
    t = time.monotonic()
    n.exec(["kill", "-9", pid])
    samples = []  # (t, /readyz status from the LB's side, snapshot generation of the running Envoy)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        code = readyz(kc, n)
        gen = kc.envoy_stat(n, "kube_peer_proxy_snapshot_generation")
        samples.append((round(time.monotonic() - t, 2), code, gen))
        if code == 200 and any(c != 200 for _, c, _ in samples):
            break
        time.sleep(0.2)
    results["step6_samples"] = samples[:3] + samples[-3:]
    down = [s for s in samples if s[1] != 200]
    assert down, "the load balancer never saw the node unready while Envoy restarted"
    assert samples[-1][1] == 200, f"not ready again within 120 s: {samples[-3:]}"
    # Ready again only with a snapshot: every 200 after the restart came from an Envoy with one.
    assert all(g and g >= 1 for _, c, g in samples if c == 200), samples
    results["step6_ready_again_s"] = samples[-1][0]
    results["step6_unready_s"] = round(down[-1][0] - down[0][0], 2)
    new_pid = n.exec(["pgrep", "-f", "^envoy --config-path"]).stdout.split()[0]
    assert new_pid != pid
    # The kubelet restarted the container (not the pod), and reports it once its Envoy is back.
    wait_for(lambda: container(kc, n)["restartCount"] == before + 1 and kc.pod_ready(proxy_pod(n)), 60,
             "the kubelet reports the restarted container, Ready")


# ---- 7. kubeadm's upgrade without our --config is visible -----------------------------------------------

def test_7_wrong_upgrade_is_visible(kc):
    n, other = kc.nodes["cp-2"], kc.nodes["cp-1"]
    assert (kc.envoy_stat(n, PROBE_STAT) or 0) == 0
    kc.kubeadm(n, N.NEW, "upgrade", "node", UPGRADE_IGNORE, timeout=900)
    text = (n.manifests / "kube-apiserver.yaml").read_text()
    assert text.count(f"host: {n.ip}") == 3, "kubeadm moved the probes to the advertise address"
    wait_for(lambda: (kc.envoy_stat(n, PROBE_STAT) or 0) > 0, 60, "kubelet probes counted at cp-2's Envoy")
    assert (kc.envoy_stat(other, PROBE_STAT) or 0) == 0
    status = n.exec([sys.executable, "-m", "kpp.status", "127.0.0.1:9901"], env={**os.environ, "PYTHONPATH": str(ROOT / "python")}).stdout
    assert "WARNING" in status, status
    results["step7_probes_counted"] = kc.envoy_stat(n, PROBE_STAT)
    # the runbook's fix: upgrade node again with the documented --config
    kc.kubeadm(n, N.NEW, "upgrade", "node", f"--config={N.KPP_DIR}/upgrade-config.yaml",
               UPGRADE_IGNORE, timeout=900)
    assert (n.manifests / "kube-apiserver.yaml").read_text().count("host: 127.0.0.1") == 3
    time.sleep(15)
    a = kc.envoy_stat(n, PROBE_STAT)
    time.sleep(25)
    assert kc.envoy_stat(n, PROBE_STAT) == a, "probes still arrive at Envoy after the fix"
    results["step7_after_fix"] = a
