"""kube-peer-proxy-status --watch in a real terminal (tmux, 120x40): what a person sees.

The demo topology (fake apiservers a old, b and c new; Envoy with the filter in front of a). The view
must show the node and its three members, fit in the terminal's width, and update in place: after c
stops, the next refreshes show c's discovery errors, then c not fresh, without scrolling the old
screens into the pane. The kubelet-probe line shows 0 and no WARNING until a kube-probe request (not the
static pod's own) comes through.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from kpp.testing import harness
from kpp.testing.proc import wait_until
from kpp.testing.topology import NEW_ONLY

WIDTH, HEIGHT = 120, 40
SHORT = {"refresh_interval": "500ms", "fetch_timeout": "1s", "staleness_limit": "2s"}


def tmux(*args) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True, timeout=10).stdout


@pytest.fixture
def session():
    if shutil.which("tmux") is None:
        raise RuntimeError("tmux is missing (apt-get install tmux)")
    name = f"kpp-status-{time.monotonic_ns()}"
    yield name
    subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def screen(name: str) -> list[str]:
    return tmux("capture-pane", "-p", "-t", name).splitlines()


def test_watch_refreshes_in_place_and_fits_the_terminal(topo, session):
    topo.start(plugin=SHORT)
    topo.envoy.wait_fresh(["a", "b", "c"], 20)
    for _ in range(10):
        assert topo.get(NEW_ONLY).status == 200  # rerouted to b or c
    cmd = f"{harness.ROOT / '.venv/bin/kube-peer-proxy-status'} --watch --interval 1 a=127.0.0.1:{topo.envoy.admin_port}"
    tmux("new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", str(HEIGHT), cmd)

    def shows(*needles):
        lines = screen(session)
        text = "\n".join(lines)
        return lines if all(n in text for n in needles) else None

    lines = wait_until(lambda: shows("node a", "a: fresh", "b: fresh", "c: fresh", "reroutes/s by code"), 10, 0.2,
                       message="the watch never showed node a with three fresh members:\n" + "\n".join(screen(session)))
    print("\n".join(lines))
    assert all(len(ln) <= WIDTH for ln in lines)
    assert any("resource.k8s.io/v1/resourceclaims 10" in ln for ln in lines), lines
    assert any(ln.startswith("  kubelet probes proxied  0 total") for ln in lines), lines
    assert not any("WARNING" in ln for ln in lines), lines
    first_clock = lines[0]
    for _ in range(3):
        assert topo.get("/livez", User_Agent="kube-probe/1.36").status == 200
    lines = wait_until(lambda: shows("kubelet probes proxied  3 total", "WARNING"), 10, 0.2,
                       message="the kubelet probes never showed:\n" + "\n".join(screen(session)))
    assert all(len(ln) <= WIDTH for ln in lines)
    topo.c.stop()
    lines = wait_until(lambda: shows("c unreachable"), 10, 0.2,
                       message="c's discovery errors never showed:\n" + "\n".join(screen(session)))
    lines = wait_until(lambda: shows("c: NOT FRESH", "members 2/3 fresh"), 10, 0.2,
                       message="c never showed as not fresh:\n" + "\n".join(screen(session)))
    print("\n".join(lines))
    assert lines[0] != first_clock and lines[0].startswith("kube-peer-proxy status"), lines[:2]
    # In place: one header on the screen, not one per refresh.
    assert sum(ln.startswith("kube-peer-proxy status") for ln in lines) == 1, lines
    assert sum(ln.startswith("node a") for ln in lines) == 1, lines
    assert all(len(ln) <= WIDTH for ln in lines)
    # The history holds no older screens either (the view redraws from the top, it does not scroll).
    history = tmux("capture-pane", "-p", "-S", "-1000", "-t", session).splitlines()
    assert sum(ln.startswith("kube-peer-proxy status") for ln in history) == 1, history[:20]
