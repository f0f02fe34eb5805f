"""The static pod's `pki-reload` container (deploy/static-pod.yaml), run as it ships.

Envoy re-reads a file-based SDS secret's files only when something is renamed into the secret's
watched directory, while `kubeadm certs renew`, `kubeadm upgrade` and `cp` rewrite the PKI files in
place. The container's loop renames a marker into that directory whenever one of the files changes.
Tests and the kubeadm node harness run the manifest's own command (the same script and file list),
with only the two directories replaced, so what is tested is what an operator installs.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from kpp import render
from kpp.testing.cluster import Proc

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "static-pod.yaml"
CONTAINER = "pki-reload"
NODE_PKI = "/etc/kubernetes/pki"


def manifest_command(manifest: Path = MANIFEST) -> list[str]:
    pod = yaml.safe_load(manifest.read_text())
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER]
    return list(c["command"])


def command(pki: Path | str, reload_dir: Path | str, manifest: Path = MANIFEST) -> list[str]:
    """`sh -c SCRIPT NAME PKI RELOAD FILES...` with this machine's directories."""
    cmd = manifest_command(manifest)
    if cmd[4:6] != [NODE_PKI, render.RELOAD_DIR]:
        raise ValueError(f"{manifest}: {CONTAINER} arguments changed: {cmd[3:]}")
    cmd[4:6] = [str(pki), str(reload_dir)]
    return cmd


def files(manifest: Path = MANIFEST) -> list[str]:
    """The PKI files the loop watches."""
    return manifest_command(manifest)[6:]


def start(pki: Path, reload_dir: Path, log: Path, name: str = CONTAINER) -> Proc:
    """The loop as a child process (own process group, dies with its parent)."""
    Path(reload_dir).mkdir(parents=True, exist_ok=True)
    return Proc(name, command(pki, reload_dir), log).start()
