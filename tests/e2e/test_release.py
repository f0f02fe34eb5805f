"""The release (`make dist`, docs/install.md): what it contains, that it is reproducible, and that it
loads the ways users load it.

* dist/ itself: the .wasm and its sha256, the rendered bootstraps (`envoy --mode validate`), the
  static pods (the image-volume one derived from deploy/static-pod.yaml), the OCI layout of the Wasm
  image "compat" variant; two runs give the same bytes.
* Reproducible .wasm: two clean builds (one exactly `make build` into a fresh target dir, one from a
  copy of the sources in another directory with another $CARGO_HOME, then scripts/wasm-opt.sh)
  equal `make build`'s output, and no build path is in it.
* Envoy fetches the .wasm over HTTP (`vm_config.code.remote`, sha256 from the .sha256 file) and runs
  it; with a wrong sha256 it refuses it (logged) and fails closed.
* The OCI image is pushed by skopeo to a CNCF distribution registry on loopback, pulled back by
  crane (a second tool), plugin.wasm extracted, byte-identical, and Envoy runs it.
* The image-volume static pod passes `kubectl apply --dry-run=client` and `--dry-run=server`
  against a real kube-apiserver v1.36.3 (image volumes are GA there), which keeps the volume.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import tomllib
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from kpp import image_volume, render
from kpp.testing import cluster, harness
from kpp.testing.proc import status as http_status
from kpp.testing.topology import NEW_ONLY, Topology

ROOT = harness.ROOT

VERSION = tomllib.loads((ROOT / "Cargo.toml").read_text())["package"]["version"]
WASM_NAME = f"kube_peer_proxy-{VERSION}.wasm"
STARTUP_LINE = f"kube-peer-proxy {VERSION} discovery service configured"
COMPAT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE_REPO = "registry.example.com/kube-peer-proxy"
# Loopback requests never go through an HTTP(S)_PROXY from the environment.


def run(cmd, timeout=600, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, timeout=timeout, **kw)
    if r.returncode != 0:
        out = r.stdout.decode(errors="replace") if isinstance(r.stdout, bytes) else r.stdout
        err = r.stderr.decode(errors="replace") if isinstance(r.stderr, bytes) else r.stderr
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {r.returncode}\n--- stdout\n{out[-5000:]}"
                             f"\n--- stderr\n{err[-5000:]}")
    return r


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_dist(out: Path) -> Path:
    """scripts/dist.sh (what `make dist` runs after `make build`) into `out`."""
    run(["bash", ROOT / "scripts" / "dist.sh"], env={**os.environ, "DIST_DIR": str(out)}, timeout=300)
    return out


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    return make_dist(tmp_path_factory.mktemp("release") / "dist")


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ---- OCI layout reading (checks only: the image is built by buildah in scripts/dist.sh) -----------

def oci_blob(layout: Path, digest: str) -> bytes:
    algo, hexd = digest.split(":")
    data = (layout / "blobs" / algo / hexd).read_bytes()
    assert sha256(data) == hexd, f"blob {digest} does not match its digest"
    return data


def index_digest(layout: Path, tag: str = VERSION) -> str:
    index = json.loads((layout / "index.json").read_text())
    (d,) = [m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    return d["digest"]


def oci_digests(dist: Path) -> dict[str, str]:
    """dist/oci-digests.txt: {"index": ..., "linux/amd64": ..., "linux/arm64": ...}."""
    out = {}
    for line in (dist / "oci-digests.txt").read_text().splitlines():
        digest, _ref, what = line.split("  ", 2)
        out["index" if what.startswith("image index") else what.split()[0]] = digest
    return out


def layer_files(blob: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as t:
        return {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def assert_compat_manifest(manifest: dict) -> str:
    """The compat variant (solo-io/wasm spec/spec-compat.md): one tar+gzip layer, the variant
    annotation on the manifest. Returns the layer digest."""
    assert manifest["mediaType"] == OCI_MANIFEST
    assert manifest["annotations"]["module.wasm.image/variant"] == "compat"
    assert manifest["annotations"]["org.opencontainers.image.version"] == VERSION
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == COMPAT_LAYER
    return layer["digest"]


# ---- dist/ --------------------------------------------------------------------------------------

def test_dist_has_the_wasm_with_its_sha256_and_the_bootstraps_and_manifests(dist):
    wasm = (dist / WASM_NAME).read_bytes()
    assert wasm == harness.wasm_path().read_bytes(), "dist ships what make build built"
    assert (dist / f"{WASM_NAME}.sha256").read_text() == f"{sha256(wasm)}  {WASM_NAME}\n"
    run(["sha256sum", "--check", "--strict", f"{WASM_NAME}.sha256"], cwd=dist)
    run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dist)
    listed = {line.split("  ", 1)[1] for line in (dist / "SHA256SUMS").read_text().splitlines()}
    on_disk = {k for k in tree(dist) if not k.startswith("oci/") and k != "SHA256SUMS"}
    assert listed == on_disk
    assert (dist / "static-pod.yaml").read_bytes() == (ROOT / "deploy" / "static-pod.yaml").read_bytes()
    assert (dist / "rbac.yaml").read_bytes() == (ROOT / "deploy" / "rbac.yaml").read_bytes()
    assert {p.name for p in dist.iterdir()} == {
        WASM_NAME, f"{WASM_NAME}.sha256", "SHA256SUMS", "bootstrap", "oci", "oci-digests.txt", "rbac.yaml",
        "sds", "static-pod.yaml", "static-pod-image-volume.yaml"}
    assert sorted(p.name for p in (dist / "bootstrap").iterdir()) == [
        "kubeadm-cp-1-image-volume.yaml", "kubeadm-cp-1-leases.yaml", "kubeadm-cp-1.yaml", "plain.yaml"]


def wasm_filenames(bootstrap: dict) -> set[str]:
    found = set()

    def walk(o):
        if isinstance(o, dict):
            if "vm_config" in o:
                found.add(o["vm_config"]["code"]["local"]["filename"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(bootstrap)
    return found


def test_dist_bootstraps_pass_envoy_validate(dist, tmp_path):
    """The kubeadm ones with their /etc/kubernetes/pki paths pointed at a generated PKI of the same
    file names, and the .wasm path at the dist .wasm (validation loads both)."""
    pki = cluster.make_certs(tmp_path / "pki")
    # dist/sds, the TLS secrets the kubeadm bootstraps name, with the same substitution
    sds, reload_dir = tmp_path / "sds", tmp_path / "reload"
    sds.mkdir()
    reload_dir.mkdir()
    assert sorted(p.name for p in (dist / "sds").iterdir()) == sorted(render.kubeadm_sds_files("/x"))
    for f in (dist / "sds").iterdir():
        (sds / f.name).write_text(f.read_text().replace("/etc/kubernetes/pki/", f"{pki}/")
                                  .replace(render.RELOAD_DIR, str(reload_dir)))
    expected_wasm = {
        "kubeadm-cp-1.yaml": "/etc/kubernetes/kube-peer-proxy/kube_peer_proxy.wasm",
        "kubeadm-cp-1-leases.yaml": "/etc/kubernetes/kube-peer-proxy/kube_peer_proxy.wasm",
        "kubeadm-cp-1-image-volume.yaml": image_volume.WASM_PATH,
        "plain.yaml": WASM_NAME,
    }
    for name, wasm in expected_wasm.items():
        text = (dist / "bootstrap" / name).read_text()
        assert wasm_filenames(json.loads(text)) == {wasm}, name
        text = text.replace(f'"{wasm}"', json.dumps(str(dist / WASM_NAME)))
        text = text.replace(render.KUBEADM_SDS_DIR + "/", f"{sds}/")
        r = harness.validate_config(text, tmp_path / name)
        assert r.returncode == 0 and "OK" in r.stdout, f"{name}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_image_volume_pod_is_derived_from_the_static_pod(dist):
    source = yaml.safe_load((ROOT / "deploy" / "static-pod.yaml").read_text())
    variant = yaml.safe_load((dist / "static-pod-image-volume.yaml").read_text())
    reference = f"{IMAGE_REPO}:{VERSION}@{index_digest(dist / 'oci')}"
    assert variant == image_volume.derive(source, reference)
    volume = variant["spec"]["volumes"][-1]
    assert volume == {"name": "wasm", "image": {"reference": reference, "pullPolicy": "IfNotPresent"}}
    (envoy,) = [c for c in variant["spec"]["containers"] if c["name"] == image_volume.CONTAINER]
    assert envoy["volumeMounts"][-1] == {"name": "wasm", "mountPath": image_volume.MOUNT, "readOnly": True}
    # Nothing else differs from deploy/static-pod.yaml.
    variant["spec"]["volumes"].pop()
    envoy["volumeMounts"].pop()
    assert variant == source


def test_oci_layout_is_the_compat_variant_for_amd64_and_arm64(dist):
    layout = dist / "oci"
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(oci_blob(layout, index_digest(layout)))
    assert index["mediaType"] == OCI_INDEX
    platforms = {(m["platform"]["os"], m["platform"]["architecture"]): m for m in index["manifests"]}
    assert set(platforms) == {("linux", "amd64"), ("linux", "arm64")}
    assert oci_digests(dist) == {"index": index_digest(layout), **{
        f"{os_}/{arch}": m["digest"] for (os_, arch), m in platforms.items()}}
    layers = set()
    for desc in platforms.values():
        manifest = json.loads(oci_blob(layout, desc["digest"]))
        layers.add(assert_compat_manifest(manifest))
    (layer,) = layers  # one layer, shared by both platforms
    assert layer_files(oci_blob(layout, layer)) == {"plugin.wasm": (dist / WASM_NAME).read_bytes()}


def test_dist_is_reproducible(dist, tmp_path):
    again = make_dist(tmp_path / "dist")
    a, b = tree(dist), tree(again)
    assert a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []


# ---- reproducible .wasm -------------------------------------------------------------------------

SOURCES = ("Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "src")


def snapshot_sources(dest: Path) -> str:
    dest.mkdir(parents=True)
    for name in SOURCES:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / name)
    return sources_hash(dest)


def sources_hash(d: Path) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        p = d / name
        for f in sorted([p] if p.is_file() else p.rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def remap_flags(cargo_home: Path) -> str:
    # The Makefile's CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS, for another $CARGO_HOME. A different
    # formula would leave a different path in the .wasm, and the comparison below would catch it.
    return f"--remap-path-prefix={cargo_home}=/cargo"


# Two release builds from scratch: 153 s with a CPU hog on one core (2026-12-06), half of pytest.ini's
# 300 s default.
@pytest.mark.timeout(900)
def test_wasm_is_reproducible_across_clean_builds_directories_and_cargo_homes(tmp_path):
    cargo_home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    clone = tmp_path / "elsewhere" / "kube-peer-proxy"
    before = snapshot_sources(clone)

    # What `make build` leaves in target/ (incremental: a no-op after make test's own build).
    run(["make", "-s", "build"], cwd=ROOT, timeout=1800)
    shipped = harness.wasm_path().read_bytes()

    # 1: exactly `make build`, from scratch into a fresh target directory.
    target1 = tmp_path / "target-1"
    run(["make", "-s", "build"], cwd=ROOT, env={**os.environ, "CARGO_TARGET_DIR": str(target1)}, timeout=1800)
    build1 = (target1 / "kube_peer_proxy.wasm").read_bytes()

    # 2: the copied sources in another directory, with another $CARGO_HOME (its registry copied,
    # built offline), into another fresh target directory.
    home2 = tmp_path / "cargo-home-2"
    shutil.copytree(cargo_home / "registry", home2 / "registry")
    target2 = tmp_path / "target-2"
    env2 = {**os.environ, "CARGO_HOME": str(home2), "CARGO_TARGET_DIR": str(target2),
            "CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS": remap_flags(home2)}
    env2.pop("RUSTFLAGS", None)
    run(["cargo", "build", "--offline", "--release", "--target", "wasm32-wasip1"], cwd=clone, env=env2, timeout=1800)
    run(["bash", str(ROOT / "scripts" / "wasm-opt.sh"), str(target2 / "wasm32-wasip1" / "release" / "kube_peer_proxy.wasm"),
         str(target2 / "opt.wasm")], cwd=clone, timeout=600)
    build2 = (target2 / "opt.wasm").read_bytes()

    assert sources_hash(ROOT) == before, "the sources changed while the test ran; run it again"
    digests = {"make build": sha256(shipped), "clean make build": sha256(build1),
               "other dir and CARGO_HOME": sha256(build2)}
    assert len(set(digests.values())) == 1, digests

    # Both cargo's output and the optimized one (wasm-opt keeps data segments as they are).
    strings = run(["strings", "-n", "4", target1 / "wasm32-wasip1" / "release" / "kube_peer_proxy.wasm",
                   target1 / "kube_peer_proxy.wasm"], text=True).stdout
    for leak in (str(ROOT), str(cargo_home), str(home2), str(tmp_path), str(Path.home()) + "/"):
        assert leak not in strings, f"{leak} is in the .wasm"


# ---- code.remote ---------------------------------------------------------------------------------

class WasmServer:
    """A plain HTTP server on loopback serving one directory, remembering the requested paths."""

    def __init__(self, directory: Path):
        self.requests: list[str] = []
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def wasm_server(dist):
    s = WasmServer(dist)
    yield s
    s.close()


def with_remote_code(bootstrap_yaml: str, port: int, path: str, sha: str) -> str:
    """Both wasm configs (the discovery service and the HTTP filter) load the code from
    http://127.0.0.1:<port><path> through a cluster of their own, checked against `sha`."""
    b = json.loads(bootstrap_yaml)
    replaced = []

    def walk(o):
        if isinstance(o, dict):
            if "vm_config" in o:
                assert "local" in o["vm_config"]["code"]
                o["vm_config"]["code"] = {"remote": {
                    "http_uri": {"uri": f"http://127.0.0.1:{port}{path}", "cluster": "wasm-release",
                                 "timeout": "10s"},
                    "sha256": sha}}
                replaced.append(o["name"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(b)
    assert sorted(replaced) == ["kube-peer-proxy", "kube-peer-proxy-discovery"], replaced
    b["static_resources"]["clusters"].append({
        "name": "wasm-release", "type": "STATIC", "connect_timeout": "2s",
        "load_assignment": {"cluster_name": "wasm-release", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}})
    return json.dumps(b, indent=2) + "\n"


def start_remote(topo, envoys, wasm_server, sha: str):
    yaml_text, port, admin = topo.bootstrap()
    config = with_remote_code(yaml_text, wasm_server.port, f"/{WASM_NAME}", sha)
    # config:debug shows the fetcher's own lines (which include the sha256 verdict).
    topo.envoy = envoys.start(config, "a", admin, component_log_level="wasm:debug,config:debug")
    topo.port = port
    return topo.envoy


def test_envoy_loads_the_wasm_from_http_with_its_sha256(topo, envoys, wasm_server, dist):
    sha = (dist / f"{WASM_NAME}.sha256").read_text().split()[0]
    envoy = start_remote(topo, envoys, wasm_server, sha)
    envoy.wait_snapshot(30)
    assert f"/{WASM_NAME}" in wasm_server.requests
    r = topo.get(NEW_ONLY)
    assert r.status == 200 and r.headers.get("x-fake-peer-proxied") == "true", r
    assert r.headers.get("x-fake-apiserver") in {"b", "c"}, r
    log = envoy.log_text()
    assert STARTUP_LINE in log
    assert f"fetch remote data [uri = http://127.0.0.1:{wasm_server.port}/{WASM_NAME}]: success" in log


def test_envoy_refuses_the_remote_wasm_when_the_sha256_is_wrong(topo, envoys, wasm_server, dist):
    good = (dist / f"{WASM_NAME}.sha256").read_text().split()[0]
    wrong = sha256(b"not the release")
    assert wrong != good
    envoy = start_remote(topo, envoys, wasm_server, wrong)
    uri = f"http://127.0.0.1:{wasm_server.port}/{WASM_NAME}"
    # Envoy got the bytes, hashed them, refused them, retried, gave up: the lines an operator sees
    # (the first at debug level for the `config` component, the others at the default level).
    harness.wait_until(lambda: "Plugin kube-peer-proxy failed to load" in envoy.log_text(), 30,
                       message="envoy did not report the filter as failed")
    log = envoy.log_text()
    assert f"fetch remote data [uri = {uri}]: data is invalid" in log
    assert "Retry limit exceeded for fetching data from remote data source." in log
    assert "Plugin kube-peer-proxy-discovery failed to load" in log
    assert STARTUP_LINE not in log
    assert f"/{WASM_NAME}" in wasm_server.requests
    # Fails closed: a Kubernetes Status 503, and the apiserver never sees the request.
    r = topo.get(NEW_ONLY)
    assert r.status == 503 and r.json()["reason"] == "ServiceUnavailable", r
    assert not any(q["path"].startswith(NEW_ONLY) for inst in (topo.a, topo.b, topo.c)
                   for q in topo.fake_requests(inst))


# ---- the OCI image through a registry -------------------------------------------------------------

@pytest.fixture
def registry(tmp_path):
    """The CNCF distribution registry (scripts/setup.sh builds it) on a free loopback port."""
    port = harness.free_port()
    config = tmp_path / "registry.yaml"
    config.write_text(json.dumps({
        "version": 0.1, "log": {"level": "info"},
        "storage": {"filesystem": {"rootdirectory": str(tmp_path / "registry-data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "kube-peer-proxy-test"}}))
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
           "OTEL_LOGS_EXPORTER": "none"}
    proc = cluster.Proc("registry", [harness.tool("registry"), "serve", config],
                        tmp_path / "registry.log", env=env).start()

    def up():
        if not proc.alive():
            raise AssertionError(f"registry exited:\n{proc.log_tail()}")
        return http_status(f"http://127.0.0.1:{port}/v2/", timeout=1) == 200
    try:
        harness.wait_until(up, 30, message=f"registry not up on :{port}:\n{proc.log_tail()}")
        yield f"127.0.0.1:{port}"
    finally:
        proc.stop()


def test_oci_image_pushed_with_skopeo_pulled_with_crane_runs_in_envoy(dist, registry, topo, envoys, tmp_path):
    ref = f"{registry}/kube-peer-proxy:{VERSION}"
    digest = index_digest(dist / "oci")
    # Push: skopeo (containers/image), the layout exactly as built.
    run(["skopeo", "copy", "--all", "--dest-tls-verify=false", f"oci:{dist / 'oci'}:{VERSION}", f"docker://{ref}"])

    # Pull: crane (go-containerregistry, what Istio's and Envoy Gateway's fetchers use).
    crane = harness.tool("crane")
    digests = oci_digests(dist)
    assert run([crane, "digest", ref], text=True).stdout.strip() == digest == digests["index"], \
        "the index digest survives the push"
    extracted = {}
    for arch in ("amd64", "arm64"):
        platform = f"linux/{arch}"
        # What Istio and Envoy Gateway compare their sha256 with: the resolved platform manifest's digest.
        assert run([crane, "digest", "--platform", platform, ref], text=True).stdout.strip() == digests[platform]
        manifest = json.loads(run([crane, "manifest", "--platform", platform, ref], text=True).stdout)
        layer = assert_compat_manifest(manifest)
        # As Istio's fetcher does: the layer blob, gunzipped, plugin.wasm taken from the tar.
        blob = run([crane, "blob", f"{registry}/kube-peer-proxy@{layer}"]).stdout
        assert layer_files(blob).keys() == {"plugin.wasm"}
        # crane export: the image's filesystem as a tar stream.
        flat = run([crane, "export", "--platform", platform, ref, "-"]).stdout
        with tarfile.open(fileobj=io.BytesIO(flat)) as t:
            names = [m.name for m in t.getmembers()]
            assert names == ["plugin.wasm"], names
            extracted[arch] = t.extractfile("plugin.wasm").read()
        assert layer_files(blob)["plugin.wasm"] == extracted[arch]
    release = (dist / WASM_NAME).read_bytes()
    assert extracted == {"amd64": release, "arm64": release}

    plugin = tmp_path / "pulled" / "plugin.wasm"
    plugin.parent.mkdir()
    plugin.write_bytes(extracted["amd64"])
    yaml_text, port, admin = topo.bootstrap()
    yaml_text = yaml_text.replace(json.dumps(str(harness.wasm_path())), json.dumps(str(plugin)))
    assert wasm_filenames(json.loads(yaml_text)) == {str(plugin)}
    topo.envoy = envoys.start(yaml_text, "a", admin)
    topo.port = port
    topo.envoy.wait_snapshot(30)
    r = topo.get(NEW_ONLY)
    assert r.status == 200 and r.headers.get("x-fake-apiserver") in {"b", "c"}, r
    assert STARTUP_LINE in topo.envoy.log_text()


# ---- the image-volume static pod against a real kube-apiserver ------------------------------------

@pytest.fixture(scope="module")
def apiserver(tmp_path_factory):
    """etcd + one kube-apiserver v1.36.3, built before the Python tests by `make k8s-build` (a
    prerequisite of `make test-python`); missing binaries fail here naming that target."""
    for component, version in (("etcd", cluster.ETCD_VERSION), ("kube-apiserver", cluster.DEFAULT_VERSION)):
        cluster.binary(component, version)
    cp = cluster.ControlPlane(tmp_path_factory.mktemp("k8s"), [("a", cluster.DEFAULT_VERSION, "")],
                              kubectl=str(harness.tool("kubectl")))
    try:
        cp.start()
        server = cp.servers["a"]
        kubeconfig = cp.kubeconfig(server.url, cp.admin_token, cp.workdir / "admin.kubeconfig")
        yield cp, kubeconfig
    except BaseException:
        for s in cp.servers.values():
            if s.proc:
                print(f"==== kube-apiserver {s.name}\n{s.proc.log_tail(80)}")
        raise
    finally:
        cp.stop()


def test_image_volume_static_pod_passes_kubectl_dry_run(apiserver, dist, tmp_path):
    cp, kubeconfig = apiserver
    pod_file = dist / "static-pod-image-volume.yaml"
    reference = f"{IMAGE_REPO}:{VERSION}@{index_digest(dist / 'oci')}"

    r = cp.kubectl_run(kubeconfig, "apply", "--dry-run=client", "-f", str(pod_file))
    assert r.stdout.strip() == "pod/kube-peer-proxy created (dry run)", r.stdout + r.stderr
    r = cp.kubectl_run(kubeconfig, "apply", "--dry-run=client", "-f", str(dist / "static-pod.yaml"))
    assert r.stdout.strip() == "pod/kube-peer-proxy created (dry run)", r.stdout + r.stderr

    # The server's dry run validates the whole pod (strict field validation) and keeps the image
    # volume. A pod needs its namespace's default service account to pass admission; without a
    # controller-manager nobody creates it, so it is created here.
    cp.kubectl_run(kubeconfig, "-n", "kube-system", "create", "serviceaccount", "default", check=False)
    r = cp.kubectl_run(kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-o", "json", "-f",
                       str(pod_file))
    pod = json.loads(r.stdout)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["wasm"]["image"] == {"reference": reference, "pullPolicy": "IfNotPresent"}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["wasm"]["mountPath"] == image_volume.MOUNT and mounts["wasm"]["readOnly"] is True

    # The validation has teeth: a misspelt image-volume field is refused.
    bad = tmp_path / "bad.yaml"
    bad.write_text(pod_file.read_text().replace("pullPolicy: IfNotPresent", "pullPolicyy: IfNotPresent"))
    r = cp.kubectl_run(kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-f", str(bad), check=False)
    assert r.returncode != 0 and "pullPolicyy" in r.stderr, r.stdout + r.stderr
