"""Many Envoy workers (one wasm VM each), as on a node that leaves Envoy's default concurrency: every
worker routes from the one table in shared data (no worker holds a copy), and every worker follows
the key set when it changes twice (the two key-entry slots alternate and come back)."""

from __future__ import annotations

import re
import time

from kpp.testing import harness
from kpp.testing.proc import served_by
from kpp.testing.topology import COMMON, NEW_ONLY, request

WORKERS = 8
# Connections are spread over the workers by the kernel (SO_REUSEPORT): with 120 fresh connections
# the chance that one of 8 workers gets none is 8 × (7/8)^120 ≈ 1e-6.
CONNECTIONS = 120


def per_worker_connections(envoy, port: int) -> dict[int, int]:
    stats = envoy.stats(r"^listener\.127\.0\.0\.1_%d\.worker_\d+\.downstream_cx_total$" % port)
    return {int(re.search(r"worker_(\d+)\.", k).group(1)): v for k, v in stats.items()}


def answers(topo, path: str) -> set[tuple[int, str]]:
    """(status, served by) of CONNECTIONS requests, each on its own connection."""
    return {(r.status, served_by(r)) for r in (request(topo.url(path)) for _ in range(CONNECTIONS))}


def test_every_worker_routes_from_shared_data_and_follows_two_key_set_changes(topo, envoys):
    yaml, topo.port, admin = topo.bootstrap()
    topo.envoy = envoys.start(yaml, "a", admin, concurrency=WORKERS)
    topo.envoy.wait_snapshot(20)

    before = per_worker_connections(topo.envoy, topo.port)
    assert answers(topo, NEW_ONLY) == {(200, "b"), (200, "c")}
    assert answers(topo, COMMON) == {(200, "a")}
    after = per_worker_connections(topo.envoy, topo.port)
    assert sorted(after) == list(range(WORKERS)), after
    assert all(after[w] - before.get(w, 0) >= 1 for w in range(WORKERS)), (before, after)

    # Key set 2: nobody serves the new-only resources; every worker sends them to a (genuine 404).
    topo.b = topo.cluster.restart("b", apiset="old")
    topo.c = topo.cluster.restart("c", apiset="old")
    harness.wait_until(lambda: answers(topo, NEW_ONLY) == {(404, "a")}, 20, interval=0.2,
                       message="the workers still reroute after b and c stopped serving the new API")
    # Key set 3 (the first slot again): only b serves them.
    topo.b = topo.cluster.restart("b", apiset="new")
    harness.wait_until(lambda: answers(topo, NEW_ONLY) == {(200, "b")}, 20, interval=0.2,
                       message="the workers do not route to b after it serves the new API again")
    assert answers(topo, COMMON) == {(200, "a")}


def test_a_dead_peer_fails_one_request_not_one_per_worker(topo):
    """One worker's passive mark holds on every worker from the next request on. With the marks read
    on each worker's timer instead (before this test), each of the 8 workers that picked b before its
    own timer ran failed a request of its own."""
    topo.start(plugin={"refresh_interval": "5s", "staleness_limit": "30s"}, concurrency=WORKERS)
    assert answers(topo, NEW_ONLY) == {(200, "b"), (200, "c")}
    before = per_worker_connections(topo.envoy, topo.port)
    topo.b.stop()
    # Discovery has not noticed (5 s rounds, the timers run every second): only the mark can say.
    started = time.monotonic()
    statuses = [request(topo.url(NEW_ONLY)).status for _ in range(CONNECTIONS)]
    elapsed = time.monotonic() - started
    after = per_worker_connections(topo.envoy, topo.port)
    busy = [w for w in range(WORKERS) if after.get(w, 0) > before.get(w, 0)]
    assert len(busy) == WORKERS, (before, after)
    assert statuses.count(503) <= 1, (statuses, elapsed)
    assert set(statuses) <= {200, 503}, statuses
