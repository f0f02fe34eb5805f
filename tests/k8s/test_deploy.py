"""The artifacts an operator installs, checked with the real tools: the kubeadm configuration and
patch in deploy/kubeadm really move the kube-apiserver to 127.0.0.1 and its probes with it (real
kubeadm v1.36.3 renders the static pod manifest from them), the manifests parse, and the rendered
kubeadm-profile bootstrap passes `envoy --mode validate`. tests/k8s/test_kubeadm.py runs the node
layout itself."""

from __future__ import annotations

import json
import shutil
import subprocess

import yaml

from kpp import pki_reload, render
from kpp.testing import harness
from kpp.testing.cluster import DEFAULT_VERSION, ROOT, binary

DEPLOY = ROOT / "deploy"


def kubeadm_config(root) -> str:
    """The repo's kubeadm configuration with this node's particulars filled in. kubeadm refuses a
    loopback advertise address, so the documentation-only 192.0.2.11 (RFC 5737) is written into the
    manifest; nothing connects to it."""
    docs = list(yaml.safe_load_all((DEPLOY / "kubeadm" / "kubeadm-config.yaml").read_text()))
    init = next(d for d in docs if d["kind"] == "InitConfiguration")
    cluster = next(d for d in docs if d["kind"] == "ClusterConfiguration")
    init["patches"] = {"directory": "/patches"}
    init["localAPIEndpoint"] = {"advertiseAddress": "192.0.2.11", "bindPort": 6443}
    init["nodeRegistration"] = {"name": "cp-1"}
    cluster.update({"kubernetesVersion": DEFAULT_VERSION, "certificatesDir": "/pki",
                    "controlPlaneEndpoint": "192.0.2.11:6443",
                    "etcd": {"external": {"endpoints": ["http://127.0.0.1:2379"]}}})
    return yaml.safe_dump_all([init, cluster])


def test_kubeadm_renders_the_apiserver_on_loopback_with_loopback_probes(tmp_path):
    root = tmp_path / "root"
    (root / "patches").mkdir(parents=True)
    for p in (DEPLOY / "kubeadm" / "patches").iterdir():
        shutil.copy(p, root / "patches" / p.name)
    (root / "cfg.yaml").write_text(kubeadm_config(root))
    kubeadm = binary("kubeadm", DEFAULT_VERSION)
    r = subprocess.run([str(kubeadm), "init", "phase", "control-plane", "apiserver", "--config", "/cfg.yaml",
                        "--rootfs", str(root)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Applied patch" in r.stdout + r.stderr
    pod = yaml.safe_load((root / "etc/kubernetes/manifests/kube-apiserver.yaml").read_text())
    c = pod["spec"]["containers"][0]
    flags = dict(a.split("=", 1) for a in c["command"][1:] if "=" in a)
    assert flags["--bind-address"] == "127.0.0.1"
    assert flags["--advertise-address"] == "192.0.2.11", "the advertise address (Envoy's) is unchanged"
    assert flags["--requestheader-username-headers"] == "X-Remote-User"
    assert flags["--requestheader-allowed-names"] == "front-proxy-client"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["host"] == "127.0.0.1", probe


def test_manifests_parse_and_the_kubeadm_bootstrap_validates(tmp_path):
    # `kubectl apply --dry-run=client` needs an apiserver for its REST mapping: test_kubeadm.py runs
    # it against a real one. Here: they parse, and the static pod is what a control-plane node needs.
    kinds = [d["kind"] for f in ("static-pod.yaml", "rbac.yaml")
             for d in yaml.safe_load_all((DEPLOY / f).read_text())]
    assert kinds == ["Pod", "ClusterRoleBinding", "Role", "RoleBinding", "Role", "RoleBinding"]
    pod = yaml.safe_load((DEPLOY / "static-pod.yaml").read_text())
    assert pod["spec"]["hostNetwork"] is True
    # the pki-reload container watches exactly the files the SDS secrets name
    assert sorted(pki_reload.files()) == sorted(f for fs in render.KUBEADM_SECRETS.values() for f in fs)
    assert pod["spec"]["priorityClassName"] == "system-node-critical"
    pki = tmp_path / "pki"
    subprocess.run([str(binary("kubeadm", DEFAULT_VERSION)), "init", "phase", "certs", "all",
                    "--cert-dir", str(pki), "--apiserver-advertise-address", "192.0.2.11"],
                   check=True, capture_output=True, timeout=60)
    sds = render.write_kubeadm_sds(tmp_path / "sds", pki, tmp_path / "reload")
    (tmp_path / "reload").mkdir()
    text = render.render_kubeadm(node="cp-1", node_ip="127.0.0.11", apiserver=("127.0.0.1", 6443),
                                 wasm_path=str(harness.wasm_path()), peers=[("cp-2", "127.0.0.12")], sds_dir=str(sds))
    bootstrap = tmp_path / "envoy.yaml"
    bootstrap.write_text(text)
    r = subprocess.run([str(harness.envoy_binary()), "--mode", "validate", "-c", str(bootstrap)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    b = json.loads(text)
    clusters = {c["name"]: c for c in b["static_resources"]["clusters"]}
    secrets = {f.stem: json.loads(f.read_text())["resources"][0] for f in sds.iterdir()}
    assert secrets["cluster-ca"]["validation_context"]["trusted_ca"]["filename"] == f"{pki}/ca.crt"
    assert secrets["front-proxy-client"]["tls_certificate"]["certificate_chain"]["filename"] == \
        f"{pki}/front-proxy-client.crt"
    for c in clusters.values():
        tls = c["transport_socket"]["typed_config"]["common_tls_context"]
        assert tls["combined_validation_context"]["validation_context_sds_secret_config"]["name"] == "cluster-ca"
        if c["name"] == "local-anon":
            assert "tls_certificate_sds_secret_configs" not in tls, \
                "the certless twin for requests without an asserted identity"
        else:
            assert [s["name"] for s in tls["tls_certificate_sds_secret_configs"]] == ["front-proxy-client"]
    assert clusters["peer-cp-2"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"] == {"address": "127.0.0.12", "port_value": 6444}


def test_the_kubeadm_profile_reads_its_members_from_the_kubernetes_endpointslice_by_default(tmp_path):
    """`kube-peer-proxy-render --kubeadm` without --peer, --lease-local-hostname or --no-peers: members from
    the `default/kubernetes` EndpointSlice, this node recognised by --node-ip:6443 and named by its IP,
    peers reached at their peer listener; the bootstrap validates. --no-peers: no membership at all."""
    pki = tmp_path / "pki"
    subprocess.run([str(binary("kubeadm", DEFAULT_VERSION)), "init", "phase", "certs", "all",
                    "--cert-dir", str(pki), "--apiserver-advertise-address", "192.0.2.11"],
                   check=True, capture_output=True, timeout=60)
    sds = tmp_path / "sds"

    def rendered(*extra):
        r = subprocess.run([str(ROOT / ".venv" / "bin" / "kube-peer-proxy-render"), "--kubeadm", str(pki),
                            "--node", "cp-1", "--node-ip", "10.0.0.11", "--wasm", str(harness.wasm_path()),
                            "--sds-dir", str(sds), "--write-sds", *extra],
                           capture_output=True, text=True, timeout=60, check=True)
        return r.stdout

    def plugin_of(text):
        hcm = json.loads(text)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        wasm = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.wasm")
        return json.loads(wasm["typed_config"]["config"]["configuration"]["value"])

    text = rendered()
    plugin = plugin_of(text)
    assert plugin["lease_discovery"]["source"] == "kubernetes_endpoints", plugin
    assert plugin["lease_discovery"]["local_address"] == "10.0.0.11:6443"
    assert plugin["lease_discovery"]["peer_port"] == 6444
    assert plugin["local_name"] == "10.0.0.11" and "peers" not in plugin
    bootstrap = tmp_path / "envoy.yaml"
    bootstrap.write_text(text)
    r = subprocess.run([str(harness.envoy_binary()), "--mode", "validate", "-c", str(bootstrap)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    single = plugin_of(rendered("--no-peers"))
    assert "lease_discovery" not in single and not single.get("peers"), single
