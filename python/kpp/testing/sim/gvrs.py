"""The resources the simulation exercises: old-only (1.33 set), new-only (1.37-dev set) and common ones.

Each class has its own namespace so lists and watches of one class never see another class's objects
(some old-only and new-only resources share storage, e.g. storage.k8s.io volumeattributesclasses).
"""

from __future__ import annotations

CLASSES = ("old-only", "new-only", "common")

# (class, group, version, resource, namespaced); the first namespaced entry of a class is also watched.
GVRS = [
    ("old-only", "resource.k8s.io", "v1alpha3", "resourceclaims", True),
    ("old-only", "networking.k8s.io", "v1beta1", "ipaddresses", False),
    ("old-only", "storage.k8s.io", "v1beta1", "volumeattributesclasses", False),
    ("new-only", "lifecycle.k8s.io", "v1alpha1", "evictionrequests", True),
    ("new-only", "scheduling.k8s.io", "v1beta1", "workloads", True),
    ("new-only", "resource.k8s.io", "v1", "deviceclasses", False),
    ("common", "apps", "v1", "deployments", True),
    ("common", "", "v1", "configmaps", True),
    ("common", "storage.k8s.io", "v1", "storageclasses", False),
]


def namespace(cls: str) -> str:
    return "sim-" + cls


def table() -> list[dict]:
    """GVRS as dicts with an id and the collection path (what the load generator gets as its config)."""
    out = []
    for i, (cls, group, version, resource, namespaced) in enumerate(GVRS):
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if namespaced:
            prefix += f"/namespaces/{namespace(cls)}"
        out.append({"id": i, "cls": cls, "group": group, "version": version, "resource": resource,
                    "namespaced": namespaced, "collection": f"{prefix}/{resource}"})
    return out


def served_by(apiset, gvr: dict) -> bool:
    """Whether a fake ApiSet serves the GVR."""
    return apiset.resource(gvr["group"], gvr["version"], gvr["resource"]) is not None


def check_classes() -> None:
    """The class of every GVR agrees with the fake's old and new API sets."""
    from kpp.testing.fake_apiserver import builtin_apiset

    old, new = builtin_apiset("old"), builtin_apiset("new")
    for g in table():
        want = {"old-only": (True, False), "new-only": (False, True), "common": (True, True)}[g["cls"]]
        got = (served_by(old, g), served_by(new, g))
        if got != want:
            raise AssertionError(f"{g['collection']}: served by (old, new) = {got}, class {g['cls']} wants {want}")
