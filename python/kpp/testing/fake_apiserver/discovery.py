"""Discovery documents of a fake apiserver: API sets, the legacy shapes derived from them, Accept negotiation.

The aggregated documents are the source of truth (as in a real apiserver since 1.26); every legacy document
(`APIVersions`, `APIGroupList`, `APIGroup`, `APIResourceList`) is derived from them the way client-go's
`SplitGroupsAndResources` maps one onto the other, so both views of one instance always agree.
"""

import copy
import functools
import hashlib
import json
from pathlib import Path

# The recorded discovery documents of real apiservers; the Rust tests read the same files.
FIXTURES = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "k8s-discovery"

JSON = "application/json"
AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"

_DISCOVERY_GROUP = "apidiscovery.k8s.io"
_DISCOVERY_KIND = "APIGroupDiscoveryList"
_AGGREGATED_BY_VERSION = {"v2": AGGREGATED_V2, "v2beta1": AGGREGATED_V2BETA1}
# Media types whose base matches the JSON serializer; protobuf and YAML clauses are skipped (fake has neither).
_JSON_RANGES = ("application/json", "application/*", "*/*")


def encode(obj) -> bytes:
    """Compact JSON, the bytes a response body carries (and an aggregated ETag hashes)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def etag(body: bytes) -> str:
    """The apiserver's discovery ETag: quoted upper-case hex SHA-512 of the body."""
    return '"%s"' % hashlib.sha512(body).hexdigest().upper()


def negotiate(accept: str | None, offers: tuple[str, ...]) -> str | None:
    """First offered media type that an Accept clause asks for, walking clauses in order; None means 406.

    Mirrors apiserver negotiation with discovery endpoint restrictions: a clause with conversion parameters
    (g/v/as) is acceptable only if they name an offered APIGroupDiscoveryList version; a clause without them
    asks for the plain (legacy) document. Other parameters (profile, pretty, q, ...) do not matter.
    """
    if not accept or not accept.strip():
        return JSON if JSON in offers else None
    for clause in accept.split(","):
        media_type, *raw_params = (part.strip() for part in clause.split(";"))
        if media_type.lower() not in _JSON_RANGES:
            continue
        params = dict(p.partition("=")[::2] for p in raw_params)
        params = {k.strip().lower(): v.strip().strip('"') for k, v in params.items()}
        if not {"g", "v", "as"} & params.keys():
            wanted = JSON
        elif params.get("g") == _DISCOVERY_GROUP and params.get("as") == _DISCOVERY_KIND:
            wanted = _AGGREGATED_BY_VERSION.get(params.get("v"))
        else:
            continue
        if wanted in offers:
            return wanted
    return None


def core_discovery(resource_list: dict) -> dict:
    """The aggregated `/api` document (one item, unnamed core group) for a legacy core `APIResourceList`.

    Legacy entries named `res/sub` become subresources of `res`; kinds spelled with a group/version (e.g.
    `pods/eviction` → policy/v1 Eviction) keep them in `responseKind`, others get "" like the apiserver.
    """
    resources = {}
    for entry in resource_list["resources"]:
        kind = {"group": entry.get("group", ""), "version": entry.get("version", ""), "kind": entry["kind"]}
        parent, _, sub = entry["name"].partition("/")
        if sub:
            resources[parent].setdefault("subresources", []).append(
                {"subresource": sub, "responseKind": kind, "verbs": entry["verbs"]})
            continue
        resource = {
            "resource": parent,
            "responseKind": kind,
            "scope": "Namespaced" if entry["namespaced"] else "Cluster",
            "singularResource": entry.get("singularName", ""),
            "verbs": entry["verbs"],
        }
        for field in ("shortNames", "categories"):
            if entry.get(field):
                resource[field] = entry[field]
        resources[parent] = resource
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [{"metadata": {}, "versions": [
            {"version": "v1", "resources": list(resources.values()), "freshness": "Current"}]}],
    }


def _load(source) -> dict:
    """A document given inline (copied, so callers may keep mutating theirs) or as a JSON file path."""
    if isinstance(source, dict):
        return copy.deepcopy(source)
    return json.loads(Path(source).read_text())


class ApiSet:
    """The discovery an instance serves (`/api` and `/apis` aggregated documents) and lookups derived from it."""

    def __init__(self, name: str, apis: dict, api: dict, minor: str = "33"):
        self.name = name
        self.minor = minor
        self._apis = apis
        self._api = api
        # (group, version) → APIVersionDiscovery of every non-Stale version: what the instance really serves.
        self._versions = {}
        for doc in (api, apis):
            for item in doc["items"]:
                group = item["metadata"].get("name", "")
                for version in item["versions"]:
                    if version.get("freshness") != "Stale":
                        self._versions[(group, version["version"])] = version
        # Encoded once: the documents never change, and the ETag must be stable across requests.
        self._aggregated = {
            (endpoint, media_type): encode({**doc, "apiVersion": f"{_DISCOVERY_GROUP}/{version}"})
            for endpoint, doc in (("api", api), ("apis", apis))
            for version, media_type in _AGGREGATED_BY_VERSION.items()
        }
        self._group_list = self._derive_group_list()

    @classmethod
    def from_spec(cls, spec: dict) -> "ApiSet":
        """A custom set from `{"apis": path_or_obj, "api": path_or_obj, "minor": "33", "name": "custom"}`.

        Only `apis` is required; `api` defaults to the core group every real apiserver serves.
        """
        api = _load(spec["api"]) if "api" in spec else old_api_document()
        return cls(spec.get("name", "custom"), _load(spec["apis"]), api, str(spec.get("minor", "33")))

    def aggregated(self, endpoint: str, media_type: str) -> bytes:
        """Encoded aggregated document of `endpoint` ("api" or "apis") in the given discovery media type."""
        return self._aggregated[(endpoint, media_type)]

    def group_list(self) -> dict:
        """Legacy `APIGroupList` (`GET /apis` with plain JSON)."""
        return self._group_list

    def api_versions(self, server_address: str) -> dict:
        """Legacy `APIVersions` (`GET /api` with plain JSON), advertising this instance's address."""
        return {
            "kind": "APIVersions",
            "versions": [version for group, version in self._versions if group == ""],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }

    def api_group(self, group: str) -> dict | None:
        """Legacy `APIGroup` (`GET /apis/<g>`), None when no version of the group is served."""
        for entry in self._group_list["groups"]:
            if entry["name"] == group:
                return {"kind": "APIGroup", "apiVersion": "v1", **entry}
        return None

    def serves_version(self, group: str, version: str) -> bool:
        return (group, version) in self._versions

    def resource(self, group: str, version: str, resource: str) -> dict | None:
        """The served APIResourceDiscovery for a GVR, None when not served."""
        for entry in self._versions.get((group, version), {}).get("resources", []):
            if entry["resource"] == resource:
                return entry
        return None

    def resource_list(self, group: str, version: str) -> dict:
        """Legacy `APIResourceList` (`GET /api/v1`, `/apis/<g>/<v>`) with `res/sub` entries for subresources.

        Like the real server, the core list has no top-level apiVersion.
        """
        resources = []
        for entry in self._versions[(group, version)].get("resources", []):
            namespaced = entry["scope"] == "Namespaced"
            resources.append(_legacy_resource(entry["resource"], entry.get("singularResource", ""), namespaced,
                                              entry.get("responseKind"), entry["verbs"], entry))
            for sub in entry.get("subresources", []):
                resources.append(_legacy_resource(f"{entry['resource']}/{sub['subresource']}", "", namespaced,
                                                  sub.get("responseKind"), sub["verbs"], {}))
        head = {"kind": "APIResourceList"} if group == "" else {"kind": "APIResourceList", "apiVersion": "v1"}
        return {**head, "groupVersion": _group_version(group, version), "resources": resources}

    def _derive_group_list(self) -> dict:
        groups = []
        for item in self._apis["items"]:
            name = item["metadata"]["name"]
            versions = [{"groupVersion": f"{name}/{v['version']}", "version": v["version"]}
                        for v in item["versions"] if v.get("freshness") != "Stale"]
            if versions:
                groups.append({"name": name, "versions": versions, "preferredVersion": versions[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _group_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def _legacy_resource(name, singular, namespaced, response_kind, verbs, extras) -> dict:
    """One APIResource entry, fields in the Go struct order."""
    response_kind = response_kind or {}
    entry = {"name": name, "singularName": singular, "namespaced": namespaced}
    for field in ("group", "version"):
        if response_kind.get(field):
            entry[field] = response_kind[field]
    entry.update(kind=response_kind.get("kind", ""), verbs=verbs)
    for field in ("shortNames", "categories"):
        if extras.get(field):
            entry[field] = extras[field]
    return entry


@functools.cache
def old_api_document() -> dict:
    """Core `/api` document built from the only real core resource list we have (pre-1.33)."""
    return core_discovery(json.loads((FIXTURES / "legacy_api__v1.k8s-pre-1.33.json").read_text()))


def _new_api_document() -> dict:
    """Core `/api` document of a 1.33+ server.

    `pods/resize` is synthesized: the legacy fixture predates 1.33, where the resize subresource appeared,
    and it is exactly the kind of subresource-only difference peer routing has to handle.
    """
    doc = copy.deepcopy(old_api_document())
    pods = next(r for r in doc["items"][0]["versions"][0]["resources"] if r["resource"] == "pods")
    pods["subresources"].append({"subresource": "resize", "responseKind": {"group": "", "version": "", "kind": "Pod"},
                                 "verbs": ["get", "patch", "update"]})
    pods["subresources"].sort(key=lambda sub: sub["subresource"])
    return doc


@functools.cache
def builtin_apiset(name: str) -> ApiSet:
    """The named real-world API sets: `old` (≈1.33) and `new` (≈1.37-dev fork)."""
    if name == "old":
        return ApiSet("old", _load(FIXTURES / "aggregated_v2.k8s-1.33.json"), old_api_document(), "33")
    if name == "new":
        return ApiSet("new", _load(FIXTURES / "aggregated_v2.k8s-1.37-dev-fork.json"), _new_api_document(), "37")
    raise ValueError(f"unknown API set {name!r}: use 'old', 'new', a spec dict or an ApiSet")


def with_subresource(base: "str | ApiSet", group: str, version: str, resource: str, subresource: str,
                     verbs: list[str], name: str | None = None) -> ApiSet:
    """A copy of `base` whose `group/version/resource` also has `subresource` (a synthetic test addition).

    The e2e stream tests use it to give a new-only resource an exec-style subresource
    (`lifecycle.k8s.io/v1alpha1 evictionrequests/exec`), which the real 1.37 set does not have: WebSocket
    requests to it must be rerouted, and the fake answers them with an echo (see server.py).
    """
    base = resolve_apiset(base)
    apis, api = copy.deepcopy(base._apis), copy.deepcopy(base._api)
    found = False
    for doc in (api, apis):
        for item in doc["items"]:
            if item["metadata"].get("name", "") != group:
                continue
            for entry in item["versions"]:
                if entry["version"] != version:
                    continue
                for res in entry.get("resources", []):
                    if res["resource"] == resource:
                        subs = res.setdefault("subresources", [])
                        subs.append({"subresource": subresource, "responseKind": dict(res["responseKind"]),
                                     "verbs": list(verbs)})
                        subs.sort(key=lambda sub: sub["subresource"])
                        found = True
    if not found:
        raise ValueError(f"{base.name} does not serve {group}/{version} {resource}")
    return ApiSet(name or f"{base.name}+{resource}/{subresource}", apis, api, base.minor)


ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def resource_entry(group: str, version: str, resource: str, kind: str, namespaced: bool = True) -> dict:
    """An APIResourceDiscovery with every verb, as a CRD's resource is listed (no subresources)."""
    return {"resource": resource, "responseKind": {"group": group, "version": version, "kind": kind},
            "scope": "Namespaced" if namespaced else "Cluster", "singularResource": kind.lower(),
            "verbs": list(ALL_VERBS)}


def with_resource(base: "str | ApiSet", group: str, version: str, resource: str, kind: str, namespaced: bool = True,
                  name: str | None = None) -> ApiSet:
    """A copy of `base` that also serves (and lists) `group/version/resource`, adding the group/version if needed.

    The e2e membership tests use it for a resource exactly one server serves (e.g. a CRD only that server knows).
    """
    base = resolve_apiset(base)
    apis, api = copy.deepcopy(base._apis), copy.deepcopy(base._api)
    if base.resource(group, version, resource) is not None:
        raise ValueError(f"{base.name} already serves {group}/{version} {resource}")
    entry = resource_entry(group, version, resource, kind, namespaced)
    doc = api if group == "" else apis
    item = next((i for i in doc["items"] if i["metadata"].get("name", "") == group), None)
    if item is None:
        item = {"metadata": {"name": group} if group else {}, "versions": []}
        doc["items"].append(item)
    ver = next((v for v in item["versions"] if v["version"] == version), None)
    if ver is None:
        ver = {"version": version, "resources": [], "freshness": "Current"}
        item["versions"].append(ver)
    ver.setdefault("resources", []).append(entry)
    ver["resources"].sort(key=lambda r: r["resource"])
    return ApiSet(name or f"{base.name}+{resource}.{group or 'core'}", apis, api, base.minor)


def resolve_apiset(apiset: "str | dict | ApiSet") -> ApiSet:
    if isinstance(apiset, ApiSet):
        return apiset
    if isinstance(apiset, dict):
        return ApiSet.from_spec(apiset)
    return builtin_apiset(apiset)
