"""Deliberately broken filters, to prove that the upgrade runs' pass rules can fail (issue: "a control
that cannot fail proves nothing").

Each mutant is the real bootstrap with one change to the route that carries the filter's reroutes
(the first route: it matches the routing header only the filter sets). Discovery is untouched (the
discovery service calls the clusters directly, not through a route), so the filter keeps deciding as
usual and only what happens to a rerouted request changes:

* ``dead-peer``: reroutes go to a cluster whose endpoint refuses connections (127.0.0.1:1), as if
  every peer were dead or its peer listener refused us;
* ``503``: reroutes are answered 503 by Envoy itself, i.e. a filter that answers 503 for everything
  only a peer serves.

The third mutation, no filter at all, is each run's control.
"""
from __future__ import annotations

import json

from kpp import render

KINDS = ("dead-peer", "503")
DEAD_CLUSTER = "kpp-mutant-dead-peer"


def mutate(bootstrap_text: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown mutant {kind!r}; one of {KINDS}")
    b = json.loads(bootstrap_text)
    listener = b["static_resources"]["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    reroute = routes[0]
    assert reroute["match"]["headers"][0]["name"] == render.ROUTE_HEADER, reroute
    if kind == "dead-peer":
        reroute["route"] = {"cluster": DEAD_CLUSTER, "timeout": "0s"}
        b["static_resources"]["clusters"].append({
            "name": DEAD_CLUSTER, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": DEAD_CLUSTER, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}}}}]}]}})
    else:
        del reroute["route"]
        reroute["direct_response"] = {"status": 503, "body": {"inline_string": json.dumps({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "mutant: every rerouted request answered 503", "reason": "ServiceUnavailable",
            "code": 503})}}
    return json.dumps(b, indent=2) + "\n"
