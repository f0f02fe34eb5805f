"""Kubernetes request path grammar (apiserver `RequestInfoFactory.NewRequestInfo`), as far as the fake needs it."""

from dataclasses import dataclass

_PATH_VERBS = ("watch", "proxy")


@dataclass(frozen=True)
class ResourcePath:
    """A resource request path.

    `namespace` is the `namespaces/<ns>/` prefix only; unlike RequestInfo it stays empty for the `namespaces`
    resource itself (`/api/v1/namespaces/ns1[/status]`), which is cluster-scoped storage-wise.
    `path_verb` is the legacy verb prefix after the version (`watch` or `proxy`), else "".
    """

    group: str
    version: str
    namespace: str
    resource: str
    name: str
    subresource: str
    path_verb: str


def parse(path: str) -> ResourcePath | None:
    """Parse a decoded URL path; None for non-resource paths (discovery, /version, ...).

    Raises ValueError like the apiserver (which answers 500) for a verb prefix with nothing after it.
    """
    trimmed = path.strip("/")
    parts = trimmed.split("/") if trimmed else []
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return None
    if parts[0] == "apis":
        if len(parts) < 4:
            return None
        group, rest = parts[1], parts[2:]
    else:
        group, rest = "", parts[1:]
    version, rest = rest[0], rest[1:]
    path_verb = ""
    if rest[0] in _PATH_VERBS:
        if len(rest) < 2:
            raise ValueError(f"unable to determine kind and namespace from url, {path}")
        path_verb, rest = rest[0], rest[1:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    resource, name, subresource = (rest + ["", ""])[:3]
    return ResourcePath(group, version, namespace, resource, name, subresource, path_verb)
