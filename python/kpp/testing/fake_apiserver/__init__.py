"""Fake Kubernetes apiservers for tests: several instances in one process over one shared object store.

    from kpp.testing.fake_apiserver import Cluster
    cluster = Cluster()
    a = cluster.start("a", port=0, apiset="old")   # ≈1.33 discovery
    b = cluster.start("b", port=0, apiset="new")   # ≈1.37-dev discovery
    ...
    cluster.stop_all()

Each instance speaks the real wire formats (aggregated and legacy discovery, Status errors, chunked watches)
for the API set it serves; see server.py for the endpoints, including the `/__fake/*` test controls.
"""

from kpp.testing.fake_apiserver.discovery import ApiSet, builtin_apiset, resource_entry, with_resource, with_subresource
from kpp.testing.fake_apiserver.server import FAULT_MODES, Cluster, Instance

__all__ = ["ApiSet", "Cluster", "FAULT_MODES", "Instance", "builtin_apiset", "resource_entry", "with_resource",
           "with_subresource"]
