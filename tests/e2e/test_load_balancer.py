"""Three nodes behind the load balancers operators run, one node's Envoy restarted under load.

HAProxy from Debian with kubeadm's HA guide configuration (only its placeholders and addresses filled in:
kpp.testing.lb), and an Envoy TCP proxy with active health checks, in front of three nodes whose Envoys run the
static pod's own entrypoint (kpp.testing.static_envoy). Load as kpp.testing.rollout describes it: 8 keep-alive clients at
200 req/s through HAProxy, 6 watches, a kubectl-like client on new connections through the Envoy LB, all
retrying like client-go (kpp.testing.lbclient).

* With the drain (SIGTERM to the manifest's script): no node is ever DOWN while healthy, the restarting
  node is out of rotation in both load balancers before it stops accepting, and is back only after its
  new Envoy can route; 0 failed requests, no call retried by client-go, 0 watch events lost, no client
  waits longer than rollout.MAX_GAP (750 ms, re-watches included: below any retry's or back-off's wait).
* The control (SIGTERM straight to Envoy, as before): no load balancer has the node out before it stops
  accepting, and clients wait a client-go retry (1 s) or fail.
"""

from __future__ import annotations

import subprocess

from kpp.testing import lb, rollout


def show(s: dict) -> str:
    keep = ("failed", "failed_examples", "retried", "retried_examples", "longest_gap", "longest_call",
            "watch_breaks", "rewatch_max", "events_lost", "created", "timeline", "lb_down", "lb_up",
            "unexpected_down", "lb_states", "rate", "calls")
    return "\n".join(f"  {k}: {s[k]}" for k in keep)


def test_haproxy_runs_the_kubeadm_guides_configuration_with_only_placeholders_filled(tmp_path):
    cfg = lb.haproxy_config(("127.0.0.1", 16443), [("n1", "127.0.0.11", 6443), ("n2", "127.0.0.12", 6443),
                                                   ("n3", "127.0.0.13", 6443)], tmp_path / "log.sock")
    guide = lb.KUBEADM_GUIDE_HAPROXY_CFG.splitlines()
    ours = cfg.splitlines()
    # Line by line the guide's, except the frontend address, the log address and one server line per node.
    assert ours[:guide.index(lb.HOST_LINE.rstrip("\n"))] == [
        line.replace("*:${APISERVER_DEST_PORT}", "127.0.0.1:16443").replace("/dev/log", str(tmp_path / "log.sock"))
        for line in guide[:guide.index(lb.HOST_LINE.rstrip("\n"))]]
    servers = [line.strip() for line in ours if line.strip().startswith("server ")]
    assert servers == [f"server n{i} 127.0.0.1{i}:6443 check verify none" for i in (1, 2, 3)]
    assert ours[-1] == guide[-1] == "        # [...]"
    for line in ("option httpchk", "http-check connect ssl", "http-check send meth GET uri /healthz",
                 "http-check expect status 200", "mode tcp", "balance     roundrobin"):
        assert f"    {line}" in ours
    assert "inter" not in cfg and "fall" not in cfg and "rise" not in cfg, "HAProxy's defaults: 2 s, 3, 2"
    (tmp_path / "haproxy.cfg").write_text(cfg)
    check = subprocess.run([lb.haproxy_binary(), "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_restart_with_the_drain_is_invisible_to_clients_behind_haproxy_and_an_envoy_lb(tmp_path, envoys):
    s = rollout.run("drain", tmp_path, registry=envoys)
    print(rollout.table({"after (drain)": s}))
    t = s["timeline"]
    assert s["unexpected_down"] == {"haproxy": [], "envoy-lb": []}, show(s)
    for name in ("haproxy", "envoy-lb"):
        assert s["lb_down"][name] is not None and s["lb_down"][name] < t["stopped_accepting"], \
            f"{name} still sent connections when the node stopped accepting\n{show(s)}"
        assert s["lb_up"][name] is not None and s["lb_up"][name] > t["accepting_again"], show(s)
    assert t["exited"] > t["stopped_accepting"] > t["sigterm"], show(s)
    assert s["failed"] == 0, show(s)
    assert s["retried"] == 0, show(s)
    assert s["events_lost"] == 0 and s["created"] > 500, show(s)
    assert s["longest_gap"] <= rollout.MAX_GAP, show(s)
    assert s["rewatch_max"] <= rollout.MAX_GAP, show(s)
    assert s["rate"] >= 150, show(s)
    assert s["hung"] == 0


def test_control_a_plain_sigterm_is_not_seen_coming_by_the_load_balancers_and_clients_wait_or_fail(tmp_path, envoys):
    s = rollout.run("plain", tmp_path, registry=envoys)
    print(rollout.table({"before (plain SIGTERM)": s}))
    t = s["timeline"]
    assert t["exited"] - t["sigterm"] < 1.0, show(s)
    # Not seen coming: no load balancer had the node out before it stopped accepting (one may mark it DOWN
    # afterwards, when the new Envoy answers /healthz 503 until its first snapshot).
    for name, down in s["lb_down"].items():
        assert down is None or down > t["stopped_accepting"], f"{name} saw it coming?\n{show(s)}"
    assert (s["failed"] > 0 or s["retried"] > 0 or s["longest_gap"] > rollout.MAX_GAP
            or s["rewatch_max"] > rollout.MAX_GAP), show(s)
