"""Two static pods of one node at once: the kubelet re-creates the proxy's pod (e.g. after its own upgrade)
while the old pod's Envoy still drains (docs/deploy.md "A restart the load balancer sees coming").

Both pods are hostNetwork, so they share the node's ports and its abstract (per network namespace) socket
names. Here pod A and pod B run the manifest's own entrypoint (kpp.testing.static_envoy) with the same
bootstrap, the same ports and the same --base-id, as on one node:

* B's script waits while A's Envoy holds the admin port, logs it, starts its Envoy once A's has exited,
  and that first Envoy becomes ready: no container restart is needed.
* The control, a manifest copy without the wait: B's Envoy exits at once while A runs. With hot restart
  (as before, Envoy's default) on the hot-restart socket (`unable to bind domain socket ... errno=98`, what
  the real node logged); with only --disable-hot-restart on the admin port.
* A SIGTERM while B waits exits B at once with 0; past KPP_WAIT_SECONDS B starts Envoy anyway, and Envoy's
  own log says what holds the port.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from kpp.testing import harness, static_envoy
from kpp.testing.topology import request

WAIT_CALL = "wait_previous || exit 0\n"  # the script's line that waits (removed by the control)
DISABLE_HOT_RESTART = "--disable-hot-restart"
WAITING = "in use (a previous pod's Envoy?): waiting up to"


def manifest_copy(tmp_path: Path, name: str, *, wait: bool = True, hot_restart: bool = False,
                  wait_seconds: int | None = None) -> Path:
    """deploy/static-pod.yaml with the envoy container's wait removed, hot restart left on (Envoy's
    default) or another KPP_WAIT_SECONDS."""
    pod = static_envoy.pod()
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == static_envoy.CONTAINER]
    if not wait:
        assert c["command"][2].count(WAIT_CALL) == 1, "the script's wait moved: the control would not be one"
        c["command"][2] = c["command"][2].replace(WAIT_CALL, "")
    if hot_restart:
        c["args"].remove(DISABLE_HOT_RESTART)
    if wait_seconds is not None:
        (e,) = [e for e in c["env"] if e["name"] == "KPP_WAIT_SECONDS"]
        e["value"] = str(wait_seconds)
    path = tmp_path / f"static-pod-{name}.yaml"
    path.write_text(yaml.safe_dump(pod, sort_keys=False))
    return path


def pod_envoy(envoys, config: str, name: str, admin: int, manifest: Path = static_envoy.MANIFEST,
              same_node_as: static_envoy.StaticPodEnvoy | None = None) -> static_envoy.StaticPodEnvoy:
    e = static_envoy.StaticPodEnvoy(config, name, admin, workdir=envoys.base_dir / f"envoy-{name}",
                                    component_log_level="wasm:info", manifest=manifest)
    if same_node_as is not None:
        e.base_id = same_node_as.base_id  # one node: the same --base-id (0 for both on a real node)
    envoys.started.append(e)
    return e


def envoy_kids(script: static_envoy.StaticPodEnvoy) -> list[int]:
    """Pids of the script's children that are Envoy (not its `sleep` or `$(date)`)."""
    pid = script.process.pid
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return []
    out = []
    for k in kids:
        try:
            if Path(f"/proc/{k}/comm").read_text().strip() == "envoy":
                out.append(int(k))
        except FileNotFoundError:
            pass
    return out


def admin_ready(url: str) -> bool:
    try:
        status, body = harness.http_get(url + "/ready", timeout=1.0)
        return (status, body.strip()) == (200, "LIVE")
    except OSError:
        return False


def test_the_manifest_waits_before_envoy_and_disables_hot_restart():
    c = static_envoy.container()
    script = c["command"][2]
    assert script.count(WAIT_CALL) == 1 and script.index(WAIT_CALL) < script.index('envoy "$@" &')
    assert script.index("trap 'terminating=1' TERM") < script.index(WAIT_CALL), "a SIGTERM while waiting"
    assert DISABLE_HOT_RESTART in c["args"]
    # Longer than the old pod can drain: the kubelet SIGKILLs it after its grace period.
    assert int(static_envoy.env()["KPP_WAIT_SECONDS"]) > static_envoy.pod()["spec"]["terminationGracePeriodSeconds"]


def test_the_new_pod_waits_for_the_old_pods_envoy_and_its_first_envoy_becomes_ready(topo, envoys):
    config, port, admin = topo.bootstrap()
    topo.port = port
    a = pod_envoy(envoys, config, "old", admin)
    a.start()
    a.wait_snapshot(20)
    b = pod_envoy(envoys, config, "new", admin, same_node_as=a)
    b.start(wait_ready=False)
    harness.wait_until(lambda: WAITING in b.log_text(), 5, 0.05, message="B never logged that it waits")

    def still_waiting():
        assert b.process.poll() is None, f"B exited with {b.process.returncode}:\n{b.log_tail(50)}"
        assert envoy_kids(b) == [], "B started Envoy while A's still ran"

    # A serves, B waits.
    until = time.monotonic() + 2
    while time.monotonic() < until:
        still_waiting()
        time.sleep(0.05)
    r = request(topo.url("/healthz"))
    assert (r.status, r.headers.get("x-fake-apiserver")) == (200, "a"), r
    # A drains as before; B keeps waiting until A's script has stopped its Envoy.
    unready, drain = static_envoy.drain_seconds()
    t0 = a.terminate()
    deadline = t0 + unready + drain + 10
    while a.process.poll() is None and time.monotonic() < deadline:
        if "stopping Envoy" not in a.log_text():
            still_waiting()
        time.sleep(0.05)
    t_a_exit = time.monotonic()
    assert a.wait_exit(1) == 0, a.log_tail(50)
    a_log = a.log_text()
    assert "SIGTERM: failing health checks" in a_log and "no longer accepting connections" in a_log, a_log[-2000:]
    assert unready <= t_a_exit - t0 <= unready + drain + 5, t_a_exit - t0
    # B's Envoy starts once A's has gone, and that first Envoy becomes ready.
    (kid,) = harness.wait_until(lambda: envoy_kids(b), 2, 0.02, message=f"B did not start Envoy:\n{b.log_tail(50)}")
    t_b_envoy = time.monotonic()
    b.wait_until_ready(30)
    t_b_ready = time.monotonic()
    b.wait_snapshot(20)
    r = request(topo.url("/healthz"))
    assert (r.status, r.headers.get("x-fake-apiserver")) == (200, "a"), r
    assert b.process.poll() is None and envoy_kids(b) == [kid], "B's first Envoy, never restarted"
    assert t_b_envoy - t_a_exit < 1.0, (t_a_exit, t_b_envoy)
    assert t_b_ready - t_a_exit < 20, (t_a_exit, t_b_ready)
    b_log = b.log_text()
    assert b_log.count(WAITING) == 1 and "still waiting (5s)" in b_log, b_log[-3000:]
    assert "is free after" in b_log and "starting Envoy anyway" not in b_log, b_log[-3000:]
    assert b_log.count("initializing epoch 0") == 1 and "errno=98" not in b_log and "cannot bind" not in b_log
    print(f"handover: A exited {t_a_exit - t0:.2f} s after SIGTERM; B's Envoy started "
          f"{(t_b_envoy - t_a_exit) * 1000:.0f} ms later, ready after {t_b_ready - t_a_exit:.2f} s")


@pytest.mark.parametrize("hot_restart, error", [
    (True, "unable to bind domain socket with base_id="),  # what the real node logged (errno=98)
    (False, "cannot bind '127.0.0.1:{admin}': Address already in use"),
], ids=["hot-restart", "disable-hot-restart-only"])
def test_control_without_the_wait_the_new_pods_envoy_exits_while_the_old_one_runs(topo, envoys, tmp_path,
                                                                                 hot_restart, error):
    manifest = manifest_copy(tmp_path, "no-wait", wait=False, hot_restart=hot_restart)
    config, port, admin = topo.bootstrap()
    a = pod_envoy(envoys, config, "old", admin, manifest=manifest)
    a.start()
    b = pod_envoy(envoys, config, "new", admin, manifest=manifest, same_node_as=a)
    b.start(wait_ready=False)
    rc = b.wait_exit(20)
    log = b.log_text()
    assert rc != 0 and error.format(admin=admin) in log, (rc, log[-3000:])
    if hot_restart:
        assert "errno=98 (see --base-id option)" in log, log[-3000:]
    assert WAITING not in log
    assert a.process.poll() is None and admin_ready(a.admin_url), "A is unaffected"
    (line,) = [x for x in log.splitlines() if error.format(admin=admin) in x][:1]
    print(f"control ({'hot restart' if hot_restart else '--disable-hot-restart only'}): B exited {rc}: {line}")


def test_sigterm_while_waiting_exits_at_once_with_0_and_past_the_deadline_envoy_starts_anyway(topo, envoys, tmp_path):
    config, port, admin = topo.bootstrap()
    a = pod_envoy(envoys, config, "old", admin)
    a.start()
    b = pod_envoy(envoys, config, "new", admin, same_node_as=a)
    b.start(wait_ready=False)
    harness.wait_until(lambda: WAITING in b.log_text(), 5, 0.05, message="B never logged that it waits")
    b.terminate()
    rc = b.wait_exit(5)
    log = b.log_text()
    assert rc == 0, (rc, log[-2000:])
    assert b.exited_at - b.terminated_at < 1.0, b.exited_at - b.terminated_at
    assert "SIGTERM while waiting for the previous Envoy: exiting" in log and "initializing epoch" not in log, log
    assert a.process.poll() is None and admin_ready(a.admin_url), "A is unaffected"

    # KPP_WAIT_SECONDS=2: B waits 2 s, then Envoy starts, and its own log says the admin port is taken.
    c = pod_envoy(envoys, config, "late", admin, manifest=manifest_copy(tmp_path, "wait-2s", wait_seconds=2),
                  same_node_as=a)
    t_start = time.monotonic()
    c.start(wait_ready=False)
    rc = c.wait_exit(20)
    log = c.log_text()
    # bash's SECONDS counts whole seconds: a 2 s deadline can come after 1.x s.
    assert rc != 0 and c.exited_at - t_start >= 1, (rc, c.exited_at - t_start, log[-2000:])
    assert WAITING in log and "still in use after 2s: starting Envoy anyway" in log, log[-2000:]
    assert f"cannot bind '127.0.0.1:{admin}': Address already in use" in log, log[-2000:]
    assert a.process.poll() is None and admin_ready(a.admin_url), "A is unaffected"
