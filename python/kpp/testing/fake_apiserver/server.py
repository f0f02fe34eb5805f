"""HTTP side of the fake apiserver: one ThreadingHTTPServer per instance, all instances over one shared Store.

Test controls (never logged as requests):
  GET  /__fake/requests                 the request log, oldest first; DELETE clears it
  GET|POST /__fake/fault                {"discovery": one of FAULT_MODES[, "delay_ms": N][, "oversized_bytes": N]
                                        [, "paths": ["/api", ...]]}: how discovery answers; delay_ms (default 0)
                                        holds every discovery answer back N ms first; oversized_bytes (default
                                        60 MiB) is the padded size of an "oversized" document; paths (default: all)
                                        limits the fault and the delay to those discovery paths (exact, e.g. "/api"
                                        but not "/api/v1"), the others answer normally. "401" answers the
                                        apiserver's `Unauthorized` Status, as for a rejected credential.
                                        "future" answers `/api` and `/apis` (whatever the Accept) in an
                                        aggregated discovery version no filter reads yet, AGGREGATED_FUTURE (v3):
                                        the v2 document with apiVersion apidiscovery.k8s.io/v3.
  GET|POST|DELETE /__fake/serve         POST {"group", "version", "resource", "kind", "namespaced"} makes this
                                        instance serve one more resource type (every verb, over the shared store)
                                        without listing it in its discovery: a CRD in the window before the next
                                        discovery round sees it. GET lists them, DELETE removes them all.
  GET|POST|DELETE /__fake/kubernetes-endpoints
                                        POST {"addresses": [ip, ...], "port": N[, "not_ready": [ip, ...]]} writes the
                                        EndpointSlice `default/kubernetes` into the shared store as kube-apiserver's
                                        lease endpoint reconciler does (Cluster.set_kubernetes_endpoints); DELETE
                                        removes it (`--endpoint-reconciler-type=none`); GET shows it (404 if absent).
                                        The slice itself is served at its real path,
                                        /apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes.
Streaming subresources (`exec`, `attach`, `portforward`) of a served resource accept a WebSocket upgrade
(`GET` with `Upgrade: websocket`): the instance greets with one text message `<instance> <subresource> <name>`
and then echoes every text/binary message, answers pings, and closes on close.
"""

import base64
import gzip
import hashlib
import http.server
import json
import random
import socket
import ssl
import string
import sys
import threading
import time
import ipaddress
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import parse_qs, unquote, urlsplit

from kpp.testing.fake_apiserver import requestinfo, selector
from kpp.testing.fake_apiserver.discovery import (AGGREGATED_V2, AGGREGATED_V2BETA1, JSON, ApiSet, encode, etag, negotiate,
                                         resolve_apiset, resource_entry)
from kpp.testing.fake_apiserver.store import AlreadyExists, Conflict, Event, Expired, NotFound, Store

FAULT_MODES = ("ok", "500", "401", "malformed", "truncated", "timeout", "oversized", "future")
# What a future apiserver might answer `/api` and `/apis` with ("future" fault): an aggregated discovery version
# no filter release reads yet, whatever the Accept header asked for.
AGGREGATED_FUTURE = "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList"
STREAMING_SUBRESOURCES = ("exec", "attach", "portforward")
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
FAULT_TIMEOUT_SECONDS = 30
OVERSIZED_BYTES = 60 * 1024 * 1024
# The apiserver picks 30–60 min for watches without timeoutSeconds; the low end keeps stale threads bounded.
DEFAULT_WATCH_TIMEOUT_SECONDS = 1800
REQUEST_LOG_SIZE = 2000

TEXT = "text/plain; charset=utf-8"
MERGE_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
# Invalid JSON that starts like a discovery document, so only a real parser notices.
MALFORMED_BODY = b'{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[{"metadata":}]'
NOT_FOUND_TEXT = b"404 page not found\n"  # Go's http.NotFound, the apiserver's notfound handler
# Where the apiservers' lease endpoint reconciler keeps the live advertise addresses (the store's key).
KUBERNETES_SLICE_KEY = ("discovery.k8s.io", "endpointslices", "default", "kubernetes")


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    """A failure `Status`, fields in the Go struct order."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
              "reason": reason}
    if details is not None:
        status["details"] = details
    return {**status, "code": code}


NOT_SERVED = _status(404, "NotFound", "the server could not find the requested resource", {})
# What the apiserver's authentication filter answers a request whose credential it rejects.
UNAUTHORIZED = _status(401, "Unauthorized", "Unauthorized")
SERVE_FIELDS = {"group": str, "version": str, "resource": str, "kind": str, "namespaced": bool}
METHOD_NOT_ALLOWED = _status(405, "MethodNotAllowed",
                             "the server does not allow this method on the requested resource", {})


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch (also used for strategic merge patches: no patch strategies in a fake)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _watch_requested(query: dict) -> bool:
    """The apiserver's bool parsing of `watch`: missing, "0" and "false" (any case) are false, all else true."""
    values = query.get("watch")
    return values is not None and values[0] != "0" and values[0].lower() != "false"


def _seen_by(event: Event, target: "_Target", selector) -> tuple[str, dict] | None:
    """(type, object) of a store event as a watch on target sees it, None when outside the watch.

    Like the apiserver's watch cache, an object moving into or out of the selector arrives as ADDED or DELETED;
    the DELETED carries the previous object stamped with the new resourceVersion.
    """
    if event.key[:2] != (target.group, target.resource) or (target.namespace and event.key[2] != target.namespace):
        return None
    matches_now = selector(event.obj)
    if event.type != "MODIFIED":
        return (event.type, event.obj) if matches_now else None
    matched_before = selector(event.prev)
    if matches_now:
        return ("MODIFIED" if matched_before else "ADDED"), event.obj
    if matched_before:
        rv = event.obj["metadata"]["resourceVersion"]
        return "DELETED", {**event.prev, "metadata": {**event.prev["metadata"], "resourceVersion": rv}}
    return None


# Bodies larger than this are gzipped for clients that accept it, as kube-apiserver does
# (defaultGzipThresholdBytes in k8s.io/apiserver pkg/endpoints/handlers/responsewriters/writers.go).
GZIP_THRESHOLD = 128 * 1024


@dataclass(frozen=True)
class _Target:
    """A served resource as addressed by one request: where it is stored and how it is spelled in responses."""

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    namespace: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def key(self, name: str) -> tuple[str, str, str, str]:
        return self.group, self.resource, self.namespace if self.namespaced else "", name

    def details(self, name: str) -> dict:
        details = {"name": name, "group": self.group, "kind": self.resource}
        return details if self.group else {"name": name, "kind": self.resource}

    def qualified(self, name: str) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        return f'{resource} "{name}"'

    def present(self, obj: dict) -> dict:
        """The stored object as seen through this request's group/version."""
        return {**obj, "apiVersion": self.api_version}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    @property
    def instance(self) -> "Instance":
        return self.server.instance

    def log_message(self, format, *args):
        """Quiet: tests read the request log over HTTP instead."""

    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            # The handshake runs here, in the connection's own thread, not in the accept loop.
            self.request.do_handshake()
        super().setup()
        # Like Go's net/http: no Nagle delay between a response's header and body writes (with delayed ACKs
        # on the other side that costs ~40 ms per response).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.instance._track(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.instance._untrack(self.connection)

    def parse_request(self):
        # A request line arrived: from here until its answer is written the connection is busy, and a
        # graceful stop (Instance.stop(grace=...)) waits for it instead of cutting the answer.
        self.instance._busy(self.connection, True)
        return super().parse_request()

    def handle_one_request(self):
        try:
            super().handle_one_request()
        finally:
            self.instance._busy(self.connection, False)
            if self.instance.draining:
                self.close_connection = True

    def send_response(self, code, message=None):
        super().send_response(code, message)
        if self.instance.draining and code != 101:
            # Like Go's net/http in Shutdown: the last answer on a connection says so, so the client does
            # not send another request on it while it closes.
            self.send_header("Connection", "close")

    def end_headers(self):
        """Every response, whichever path produced it, names the instance and echoes loop-prevention."""
        self.send_header("x-fake-apiserver", self.instance.name)
        if isinstance(self.connection, ssl.SSLSocket):
            # Which client certificate this connection presented (TLS instances: tests of what Envoy presents).
            cert = self.connection.getpeercert()
            self.send_header("x-fake-client-cert-serial", cert.get("serialNumber", "") if cert else "none")
        headers = getattr(self, "headers", None)  # absent when the request line itself was bad
        if headers is not None and headers.get("x-kubernetes-peer-proxied") == "true":
            self.send_header("x-fake-peer-proxied", "true")
        super().end_headers()

    def _dispatch(self):
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query, keep_blank_values=True)
        body = self._read_body()
        if path.startswith("/__fake/"):
            return self._control(path, body)
        self.instance._log_request(self.command, self.path, self.headers)
        trimmed = "/" + path.strip("/")
        if trimmed in ("/healthz", "/livez", "/readyz"):
            return self._send(200, b"ok", TEXT)
        if trimmed == "/version":
            return self._send_json(200, self.instance.version_info())
        if trimmed == "/openapi/v3" and self.command == "GET":
            if not self.instance.openapi_index:
                return self._send(404, NOT_FOUND_TEXT, TEXT)
            return self._send_json(200, self.instance.openapi_v3_index())
        try:
            target = requestinfo.parse(path)
        except ValueError as err:
            message = f'Internal Server Error: "{path}": failed to create RequestInfo: {err}'
            return self._send(500, message.encode() + b"\n", TEXT)
        if target is not None:
            return self._resource(target, query, body)
        parts = trimmed.strip("/").split("/")
        if parts[0] in ("api", "apis"):
            return self._discovery(parts)
        return self._send(404, NOT_FOUND_TEXT, TEXT)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    # --- plumbing -------------------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        """Request body by Content-Length or chunked framing (Envoy re-frames HTTP/2 bodies without a length)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, code: int, body: bytes, content_type: str, headers: dict | None = None):
        headers = dict(headers or {})
        # kube-apiserver's APIResponseCompression (default on): a body over 128 KiB is gzipped for a
        # client that accepts it (apiserver responsewriters.deferredResponseWriter).
        if (code == 200 and len(body) > GZIP_THRESHOLD
                and "gzip" in self.headers.get("Accept-Encoding", "").lower()):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
            headers["Vary"] = ", ".join(filter(None, [headers.get("Vary"), "Accept-Encoding"]))
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if "Cache-Control" not in headers:
            self.send_header("Cache-Control", "no-cache, private")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, obj):
        self._send(code, encode(obj), JSON)

    def _send_status(self, status: dict):
        self._send_json(status["code"], status)

    def _json_body(self, body: bytes) -> dict | None:
        """The body as a JSON object, or None after answering 400."""
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return obj
        self._send_status(_status(400, "BadRequest", "the request body must be a JSON object"))
        return None

    # --- test control ---------------------------------------------------------------------------------------

    def _control(self, path: str, body: bytes):
        if path == "/__fake/requests" and self.command == "GET":
            return self._send_json(200, self.instance.requests())
        if path == "/__fake/requests" and self.command == "DELETE":
            self.instance.clear_requests()
            return self._send_json(200, [])
        if path == "/__fake/fault" and self.command in ("GET", "POST"):
            if self.command == "POST":
                try:
                    request = json.loads(body)
                    delay_ms = request.get("delay_ms", 0)
                    oversized = request.get("oversized_bytes", OVERSIZED_BYTES)
                    for n in (delay_ms, oversized):
                        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                            raise ValueError(n)
                    paths = request.get("paths")
                    if paths is not None:
                        if not isinstance(paths, list) or not paths or not all(
                                isinstance(p, str) and p.startswith("/") for p in paths):
                            raise ValueError(paths)
                        paths = tuple(dict.fromkeys("/" + p.strip("/") for p in paths))
                    self.instance.fault = request["discovery"]
                    self.instance.discovery_delay_ms = delay_ms
                    self.instance.oversized_bytes = oversized
                    self.instance.fault_paths = paths
                except (ValueError, KeyError, TypeError, AttributeError):
                    message = (f'want {{"discovery": one of {", ".join(FAULT_MODES)}[, "delay_ms": N]'
                               '[, "oversized_bytes": N][, "paths": ["/api", ...]]}')
                    return self._send_status(_status(400, "BadRequest", message))
            answer = {"discovery": self.instance.fault}
            if self.instance.discovery_delay_ms:
                answer["delay_ms"] = self.instance.discovery_delay_ms
            if self.instance.oversized_bytes != OVERSIZED_BYTES:
                answer["oversized_bytes"] = self.instance.oversized_bytes
            if self.instance.fault_paths is not None:
                answer["paths"] = list(self.instance.fault_paths)
            return self._send_json(200, answer)
        if path == "/__fake/kubernetes-endpoints" and self.command in ("GET", "POST", "DELETE"):
            cluster = self.instance.cluster
            if cluster is None:
                return self._send(404, NOT_FOUND_TEXT, TEXT)
            if self.command == "POST":
                try:
                    request = json.loads(body)
                    cluster.set_kubernetes_endpoints(request["addresses"], request["port"],
                                                     not_ready=request.get("not_ready", ()))
                except (ValueError, KeyError, TypeError, AttributeError):
                    message = 'want {"addresses": [ip, ...], "port": N[, "not_ready": [ip, ...]]} (IPs of one family)'
                    return self._send_status(_status(400, "BadRequest", message))
            elif self.command == "DELETE":
                cluster.delete_kubernetes_endpoints()
            try:
                return self._send_json(200, self.instance.store.get(KUBERNETES_SLICE_KEY))
            except NotFound:
                return self._send_json(404, None)
        if path == "/__fake/serve" and self.command in ("GET", "POST", "DELETE"):
            if self.command == "POST":
                try:
                    request = json.loads(body)
                    if set(request) != set(SERVE_FIELDS) or any(
                            type(request[k]) is not t for k, t in SERVE_FIELDS.items()):
                        raise ValueError(request)
                    if not all(request[k] for k in ("version", "resource", "kind")) or "/" in "".join(
                            request[k] for k in ("group", "version", "resource")):
                        raise ValueError(request)
                except (ValueError, TypeError, AttributeError):
                    message = 'want {"group": G, "version": V, "resource": R, "kind": K, "namespaced": true|false}'
                    return self._send_status(_status(400, "BadRequest", message))
                self.instance.serve(**request)
            elif self.command == "DELETE":
                self.instance.extra_resources.clear()
            return self._send_json(200, self.instance.served_extras())
        return self._send(404, NOT_FOUND_TEXT, TEXT)

    # --- discovery ------------------------------------------------------------------------------------------

    def _discovery(self, parts: list[str]):
        """`/api`, `/apis`, `/api/v1`, `/apis/<g>`, `/apis/<g>/<v>`, with the injected discovery fault."""
        if self.command != "GET":
            return self._send_status(METHOD_NOT_ALLOWED)
        fault = self.instance.fault
        delay = self.instance.discovery_delay_ms
        fault_paths = self.instance.fault_paths
        if fault_paths is not None and "/" + "/".join(parts) not in fault_paths:
            fault, delay = "ok", 0
        if delay and self.instance._stopping.wait(delay / 1000):
            self.close_connection = True
            return
        if fault == "timeout" and self.instance._stopping.wait(FAULT_TIMEOUT_SECONDS):
            self.close_connection = True  # stopped while hanging: drop the request like a dying server
            return
        if fault == "401":
            return self._send_status(UNAUTHORIZED)
        if fault == "500":
            return self._send_status(_status(500, "InternalError", "Internal error occurred: injected discovery fault",
                                             {"causes": [{"message": "injected discovery fault"}]}))
        if fault == "future" and parts in (["api"], ["apis"]):
            document = json.loads(self.instance.apiset.aggregated(parts[0], AGGREGATED_V2))
            body = encode({**document, "apiVersion": "apidiscovery.k8s.io/v3"})
            return self._send(200, body, AGGREGATED_FUTURE, {"ETag": etag(body), "Vary": "Accept",
                                                             "Cache-Control": "public"})
        document = self._discovery_document(parts)
        if document is None:
            return
        body, content_type = document
        if fault == "malformed":
            body = MALFORMED_BODY
        elif fault == "oversized":
            body += b" " * (self.instance.oversized_bytes - len(body))  # trailing whitespace keeps it valid JSON
        headers = {}
        if content_type != JSON:
            headers = {"ETag": etag(body), "Vary": "Accept", "Cache-Control": "public"}
            # A truncating fault ignores If-None-Match, else a client holding the ETag would get a clean 304.
            if self.headers.get("If-None-Match") == headers["ETag"] and fault != "truncated":
                # 304 has no body by definition, so no Content-Length either (as net/http does).
                self.send_response(304)
                for name, value in headers.items():
                    self.send_header(name, value)
                return self.end_headers()
        if fault == "truncated":
            return self._send_truncated(body, content_type, headers)
        self._send(200, body, content_type, headers)

    def _discovery_document(self, parts: list[str]) -> tuple[bytes, str] | None:
        """(body, content type) of a discovery path; None after answering 404/406 itself."""
        apiset = self.instance.apiset
        if parts in (["api"], ["apis"]):
            media_type = self._negotiate(self.instance.discovery_offers)
            if media_type is None:
                return None
            if media_type != JSON:
                return apiset.aggregated(parts[0], media_type), media_type
            if parts == ["api"]:
                return encode(apiset.api_versions(f"{self.instance.host}:{self.instance.port}")), JSON
            return encode(self.instance.group_list()), JSON
        if parts[0] == "api" or len(parts) == 3:
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            document = apiset.resource_list(group, version) if apiset.serves_version(group, version) else None
        else:
            document = apiset.api_group(parts[1])
        if document is None:
            return self._send(404, NOT_FOUND_TEXT, TEXT)
        return None if self._negotiate((JSON,)) is None else (encode(document), JSON)

    def _negotiate(self, offers: tuple[str, ...]) -> str | None:
        """The media type to answer in, or None after answering 406 like the apiserver."""
        media_type = negotiate(self.headers.get("Accept"), offers)
        if media_type is None:
            message = f"only the following media types are accepted: {', '.join(offers)}"
            self._send_status(_status(406, "NotAcceptable", message))
        return media_type

    def _send_truncated(self, body: bytes, content_type: str, headers: dict):
        """Promise the whole body, send half of it, hang up."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.close_connection = True

    # --- resources ------------------------------------------------------------------------------------------

    def _resource(self, path: requestinfo.ResourcePath, query: dict, body: bytes):
        if not self.instance.serves_version(path.group, path.version):
            return self._send(404, NOT_FOUND_TEXT, TEXT)
        resource = self.instance.resource(path.group, path.version, path.resource)
        if resource is None or path.path_verb == "proxy":  # the fake proxies nothing
            return self._send_status(NOT_SERVED)
        verbs = resource["verbs"]
        if path.subresource:
            sub = next((s for s in resource.get("subresources", []) if s["subresource"] == path.subresource), None)
            if sub is None:
                return self._send_status(NOT_SERVED)
            verbs = sub["verbs"]
        namespaced = resource["scope"] == "Namespaced"
        # Routes the apiserver does not register: namespaced items without a namespace, cluster-scoped
        # resources under a namespace.
        if (namespaced and not path.namespace and (path.name or self.command != "GET")) or (
                not namespaced and path.namespace):
            return self._send(404, NOT_FOUND_TEXT, TEXT)
        verb = self._verb(path, query)
        if verb not in verbs:
            return self._send_status(METHOD_NOT_ALLOWED)
        target = _Target(path.group, path.version, path.resource, resource["responseKind"]["kind"], namespaced,
                         path.namespace)
        if path.subresource not in ("", "status"):
            return self._other_subresource(target, path)
        if verb in ("list", "watch", "deletecollection"):
            selector = self._selector(query, path.name)
            if selector is None:
                return None
            if verb == "list":
                return self._list(target, selector)
            if verb == "watch":
                return self._watch(target, query, selector)
            return self._delete_collection(target, selector)
        if verb == "create":
            return self._create(target, body)
        if verb == "get":
            return self._get(target, path.name)
        if verb == "update":
            return self._update(target, path.name, body)
        if verb == "patch":
            return self._patch(target, path.name, body)
        return self._delete(target, path.name)

    def _selector(self, query: dict, name: str):
        """Object predicate from labelSelector/fieldSelector (and a watched name), or None after a 400."""
        field_selector = query.get("fieldSelector", [""])[0]
        if name:  # /watch/.../<name>
            field_selector = ",".join(filter(None, [field_selector, f"metadata.name={name}"]))
        try:
            return selector.parse(query.get("labelSelector", [""])[0], field_selector)
        except ValueError as err:
            self._send_status(_status(400, "BadRequest", str(err)))
            return None

    def _verb(self, path: requestinfo.ResourcePath, query: dict) -> str:
        """The discovery verb a request needs; "" for method/path combinations no route accepts."""
        if path.path_verb == "watch":
            return "watch" if self.command == "GET" else ""
        if not path.name:
            collection = {"POST": "create", "DELETE": "deletecollection"}
            if self.command == "GET":
                return "watch" if _watch_requested(query) else "list"
            return collection.get(self.command, "")
        item = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        if path.subresource:
            item["POST"] = "create"
        return item.get(self.command, "")

    def _not_found(self, target: _Target, name: str):
        self._send_status(_status(404, "NotFound", f"{target.qualified(name)} not found", target.details(name)))

    def _get(self, target: _Target, name: str):
        try:
            self._send_json(200, target.present(self.instance.store.get(target.key(name))))
        except NotFound:
            self._not_found(target, name)

    def _list(self, target: _Target, selector):
        rv, objects = self.instance.store.list(target.group, target.resource, target.namespace)
        self._send_json(200, {
            "kind": f"{target.kind}List",
            "apiVersion": target.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": [target.present(obj) for obj in objects if selector(obj)],
        })

    def _create(self, target: _Target, body: bytes):
        obj = self._json_body(body)
        if obj is None:
            return
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + "".join(random.choices(string.ascii_lowercase, k=5))
        if not name:
            message = f'{target.kind} "" is invalid: metadata.name: Required value: name or generateName is required'
            return self._send_status(_status(422, "Invalid", message, {"kind": target.kind}))
        if target.namespaced:
            if meta.get("namespace", target.namespace) not in ("", target.namespace):
                return self._send_status(_status(400, "BadRequest", "the namespace of the provided object does not "
                                                                    "match the namespace sent on the request"))
            meta["namespace"] = target.namespace
        else:
            meta.pop("namespace", None)
        meta.update(name=name, uid=str(uuid.uuid4()),
                    creationTimestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        obj.update(apiVersion=target.api_version, kind=target.kind)
        try:
            self._send_json(201, target.present(self.instance.store.create(target.key(name), obj)))
        except AlreadyExists:
            self._send_status(_status(409, "AlreadyExists", f"{target.qualified(name)} already exists",
                                      target.details(name)))

    def _write(self, target: _Target, name: str, compute):
        """Shared tail of update/patch: atomic read-modify-write with a resourceVersion precondition."""

        def change(current: dict) -> dict:
            new = compute(current)
            wanted = (new.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise Conflict()
            meta = new.setdefault("metadata", {})
            for field in ("name", "namespace", "uid", "creationTimestamp"):
                if field in current["metadata"]:
                    meta[field] = current["metadata"][field]
            return {**new, "apiVersion": target.api_version, "kind": target.kind}

        try:
            self._send_json(200, target.present(self.instance.store.update(target.key(name), change)))
        except NotFound:
            self._not_found(target, name)
        except Conflict:
            message = (f"Operation cannot be fulfilled on {target.qualified(name)}: the object has been modified; "
                       "please apply your changes to the latest version and try again")
            self._send_status(_status(409, "Conflict", message, target.details(name)))

    def _update(self, target: _Target, name: str, body: bytes):
        obj = self._json_body(body)
        if obj is None:
            return
        body_name = (obj.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            message = f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            return self._send_status(_status(400, "BadRequest", message))
        self._write(target, name, lambda current: obj)

    def _patch(self, target: _Target, name: str, body: bytes):
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type not in MERGE_PATCH_TYPES:
            message = ("the body of the request was in an unknown format - accepted media types include: "
                       + ", ".join(MERGE_PATCH_TYPES))
            return self._send_status(_status(415, "UnsupportedMediaType", message))
        patch = self._json_body(body)
        if patch is not None:
            self._write(target, name, lambda current: merge_patch(current, patch))

    def _delete(self, target: _Target, name: str):
        try:
            self._send_json(200, target.present(self.instance.store.delete(target.key(name))))
        except NotFound:
            self._not_found(target, name)

    def _delete_collection(self, target: _Target, selector):
        self.instance.store.delete_collection(target.group, target.resource, target.namespace, selector)
        self._send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})

    def _other_subresource(self, target: _Target, path: requestinfo.ResourcePath):
        """Served subresources beyond status: enough behaviour to tell which instance answered."""
        try:
            parent = self.instance.store.get(target.key(path.name))
        except NotFound:
            return self._not_found(target, path.name)
        if path.subresource == "log":
            return self._send(200, f"fake log from {self.instance.name}\n".encode(), TEXT)
        if path.subresource in STREAMING_SUBRESOURCES and "websocket" in self.headers.get("Upgrade", "").lower():
            return self._websocket_echo(path)
        self._send_json(200, target.present(parent))

    # --- WebSocket echo (exec-style streaming subresources) ---------------------------------------------------

    def _websocket_echo(self, path: requestinfo.ResourcePath):
        """RFC 6455 server side: handshake, a greeting naming the instance, then echo until close."""
        key = self.headers.get("Sec-WebSocket-Key", "")
        if self.command != "GET" or not key or "upgrade" not in self.headers.get("Connection", "").lower():
            return self._send_status(_status(400, "BadRequest", "invalid WebSocket upgrade request"))
        accept = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        if offered:
            self.send_header("Sec-WebSocket-Protocol", offered[0])
        self.end_headers()
        self.close_connection = True
        try:
            self.wfile.flush()
            self._ws_send(0x1, f"{self.instance.name} {path.subresource} {path.name}".encode())
            while not self.instance.stopped:
                frame = self._ws_receive()
                if frame is None:
                    return
                opcode, payload = frame
                if opcode == 0x8:  # close: echo the status code and stop
                    self._ws_send(0x8, payload[:2])
                    return
                if opcode == 0x9:
                    self._ws_send(0xA, payload)
                elif opcode in (0x1, 0x2):
                    self._ws_send(opcode, payload)
        except OSError:
            return

    def _ws_receive(self) -> tuple[int, bytes] | None:
        """One whole (possibly fragmented) client message; None when the peer hung up."""
        message, message_opcode = b"", None
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return None
            fin, opcode, masked, length = head[0] & 0x80, head[0] & 0x0F, head[1] & 0x80, head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(self.rfile.read(2), "big")
            elif length == 127:
                length = int.from_bytes(self.rfile.read(8), "big")
            mask = self.rfile.read(4) if masked else b""
            data = self.rfile.read(length)
            if len(data) < length:
                return None
            if mask and length:
                repeated = (mask * (length // 4 + 1))[:length]
                data = (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(length, "big")
            if opcode >= 0x8:  # control frames are never fragmented and may interleave
                return opcode, data
            if opcode:
                message_opcode = opcode
            message += data
            if fin:
                return message_opcode or 0x1, message

    def _ws_send(self, opcode: int, payload: bytes):
        length = len(payload)
        if length < 126:
            head = bytes([0x80 | opcode, length])
        elif length < 1 << 16:
            head = bytes([0x80 | opcode, 126]) + length.to_bytes(2, "big")
        else:
            head = bytes([0x80 | opcode, 127]) + length.to_bytes(8, "big")
        self.wfile.write(head + payload)
        self.wfile.flush()

    # --- watch ----------------------------------------------------------------------------------------------

    def _watch(self, target: _Target, query: dict, selector):
        """Chunked stream of watch events, one JSON line per chunk, until timeout, stop or client hang-up."""
        store = self.instance.store
        rv_param = query.get("resourceVersion", [""])[0]
        try:
            since = int(rv_param) if rv_param not in ("", "0") else None
            timeout = float(query.get("timeoutSeconds", [DEFAULT_WATCH_TIMEOUT_SECONDS])[0])
        except ValueError as err:
            return self._send_status(_status(400, "BadRequest", f"invalid watch parameter: {err}"))
        deadline = time.monotonic() + timeout

        if since is None:
            cursor, objects = store.list(target.group, target.resource, target.namespace)
            pending = [("ADDED", target.present(obj)) for obj in objects if selector(obj)]
        else:
            cursor, pending = since, []  # the loop below replays what came after `since`
        self.send_response(200)
        self.send_header("Content-Type", JSON)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            while True:
                for type_, obj in pending:
                    self._write_chunk(encode({"type": type_, "object": obj}) + b"\n")
                if any(type_ == "ERROR" for type_, _ in pending):
                    break
                with store.cond:
                    while (store.resource_version == cursor and not self.instance.stopped
                           and not self.instance.draining and time.monotonic() < deadline):
                        store.cond.wait(deadline - time.monotonic())
                    if self.instance.stopped or self.instance.draining or time.monotonic() >= deadline:
                        break
                    try:
                        seen = (_seen_by(event, target, selector) for event in store.events_after(cursor))
                        pending = [(type_, target.present(obj)) for type_, obj in filter(None, seen)]
                    except Expired as err:
                        pending = [("ERROR", _status(410, "Expired", str(err)))]
                    cursor = store.resource_version
            self._write_chunk(b"")
        except OSError:  # client went away, or stop() shut the socket
            self.close_connection = True
            return
        self.close_connection = self.instance.stopped or self.instance.draining

    def _write_chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    instance: "Instance"
    tls: "ssl.SSLContext | None" = None

    def get_request(self):
        sock, addr = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request, client_address):
        """Connection resets are normal here (stop(), clients dropping watches, truncation); other errors are bugs."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class Instance:
    """One fake apiserver listening on 127.0.0.1, serving `apiset` over the cluster's shared store."""

    def __init__(self, name: str, store: Store, apiset: ApiSet, port: int = 0, aggregated: bool = True,
                 accept_v2beta1: bool = False, tls: "ssl.SSLContext | None" = None, host: str = "127.0.0.1",
                 cluster: "Cluster | None" = None):
        self.name = name
        self.host = host
        self.cluster = cluster
        self.store = store
        self.apiset = apiset
        self.aggregated = aggregated
        self.accept_v2beta1 = accept_v2beta1
        # What `/api` and `/apis` can answer in: legacy always, aggregated like 1.26+ servers, v2beta1 like ≤1.32.
        self.discovery_offers = (JSON,) + ((AGGREGATED_V2,) if aggregated else ()) + (
            (AGGREGATED_V2BETA1,) if aggregated and accept_v2beta1 else ())
        self._fault = "ok"
        self.fault_paths: tuple[str, ...] | None = None  # None: the fault applies to every discovery path
        self.discovery_delay_ms = 0
        # (group, version, resource) → APIResourceDiscovery of types served but not in discovery (/__fake/serve).
        self.extra_resources: dict[tuple[str, str, str], dict] = {}
        self.oversized_bytes = OVERSIZED_BYTES
        # `/openapi/v3` (the index kube-apiserver serves from its own handlers since 1.27); False: 404 there.
        self.openapi_index = True
        # Group versions served but left out of the legacy APIGroupList, as kube-apiserver's aggregator does
        # while another server's autoregister controller has deleted their APIService in the shared etcd.
        self.unlisted_group_versions: set[tuple[str, str]] = set()
        self._log = deque(maxlen=REQUEST_LOG_SIZE)
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._busy_connections: set[socket.socket] = set()
        self._idle = threading.Condition(self._lock)  # notified when a connection's answer is written
        self._draining = threading.Event()
        self._stopping = threading.Event()
        self._server = _Server((host, port), _Handler)
        self._server.instance = self
        self._server.tls = self.tls = tls
        self.port = self._server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://{host}:{self.port}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                         name=f"fake-apiserver-{name}").start()

    @property
    def fault(self) -> str:
        """Current discovery fault mode, one of FAULT_MODES."""
        return self._fault

    @fault.setter
    def fault(self, mode: str):
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}")
        self._fault = mode

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    @property
    def draining(self) -> bool:
        """In a graceful stop: answers being written finish, and their connections close after them."""
        return self._draining.is_set()

    def serve(self, group: str, version: str, resource: str, kind: str, namespaced: bool):
        """Serve one more resource type, every verb, without listing it in discovery (see /__fake/serve)."""
        self.extra_resources[(group, version, resource)] = resource_entry(group, version, resource, kind, namespaced)

    def served_extras(self) -> list[dict]:
        return [{"group": g, "version": v, "resource": r, "kind": e["responseKind"]["kind"],
                 "namespaced": e["scope"] == "Namespaced"} for (g, v, r), e in self.extra_resources.items()]

    def serves_version(self, group: str, version: str) -> bool:
        """Whether requests to the group/version are routed at all (its API set's, or an extra type's)."""
        return self.apiset.serves_version(group, version) or any(
            (g, v) == (group, version) for g, v, _ in self.extra_resources)

    def resource(self, group: str, version: str, resource: str) -> dict | None:
        """The APIResourceDiscovery requests to a resource are served by, None when not served."""
        return self.apiset.resource(group, version, resource) or self.extra_resources.get((group, version, resource))

    def group_list(self) -> dict:
        """The legacy APIGroupList, without `unlisted_group_versions` (a group left with none is left out)."""
        doc = json.loads(json.dumps(self.apiset.group_list()))
        groups = []
        for g in doc.get("groups") or []:
            g["versions"] = [v for v in g["versions"] if (g["name"], v["version"]) not in self.unlisted_group_versions]
            if g["versions"]:
                if g.get("preferredVersion", {}).get("version") not in {v["version"] for v in g["versions"]}:
                    g["preferredVersion"] = g["versions"][0]
                groups.append(g)
        doc["groups"] = groups
        return doc

    def openapi_v3_index(self) -> dict:
        """`GET /openapi/v3` as kube-openapi's handler3 writes it: one `paths` key per group version served
        (`api/v1`, `apis/<g>/<v>`) and the root paths, each with its `serverRelativeURL`."""
        keys = ["api", "apis", "version", ".well-known/openid-configuration"]
        keys += [f"api/{v}" for v in self.apiset.api_versions("")["versions"]]
        keys += [f"apis/{g['name']}/{v['version']}" for g in self.apiset.group_list().get("groups") or []
                 for v in g["versions"]]
        return {"paths": {k: {"serverRelativeURL": f"/openapi/v3/{k}?hash={'0' * 128}"} for k in keys}}

    def version_info(self) -> dict:
        minor = self.apiset.minor
        return {
            "major": "1", "minor": minor, "emulationMajor": "1", "emulationMinor": minor,
            "minCompatibilityMajor": "1", "minCompatibilityMinor": str(int(minor) - 1),
            "gitVersion": f"v1.{minor}.0-fake+{self.name}", "gitCommit": "0" * 40, "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64",
        }

    def requests(self) -> list[dict]:
        """Logged requests, oldest first: {"method", "path", "headers": {lowercased name: value}}."""
        with self._lock:
            return list(self._log)

    def clear_requests(self):
        with self._lock:
            self._log.clear()

    def stop(self, grace: float = 0.0):
        """Close the listener and every open connection, ending watches and hung requests, so the port is free.

        With `grace` (seconds), first drain as kube-apiserver does on SIGTERM (Go's http.Server.Shutdown): the
        listener closes, idle keep-alive connections close, and a request being answered gets its whole answer
        (its connection closes after it) until `grace` runs out; watches end at once. Without it, an answer
        being written is cut wherever it is (a crash), e.g. between its header and its body."""
        if grace > 0:
            self._drain(grace)
        with self._lock:
            self._stopping.set()
            connections = list(self._connections)
        with self.store.cond:
            self.store.cond.notify_all()  # watches re-check _stopping
        self._server.shutdown()
        self._server.server_close()
        for connection in connections:
            _hang_up(connection)

    def _drain(self, grace: float):
        deadline = time.monotonic() + grace
        self._draining.set()
        with self.store.cond:
            self.store.cond.notify_all()  # watches re-check draining and end
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            while True:
                # Idle connections wait for their next request line: nothing of an answer is lost by closing them.
                for connection in self._connections - self._busy_connections:
                    _hang_up(connection)
                left = deadline - time.monotonic()
                if not self._busy_connections or left <= 0:
                    return
                self._idle.wait(left)

    def _busy(self, connection: socket.socket, busy: bool):
        with self._lock:
            if busy:
                self._busy_connections.add(connection)
            else:
                self._busy_connections.discard(connection)
                self._idle.notify_all()

    def _log_request(self, method: str, path: str, headers):
        entry = {"method": method, "path": path, "headers": {}}
        for name, value in headers.items():
            name = name.lower()
            entry["headers"][name] = f"{entry['headers'][name]}, {value}" if name in entry["headers"] else value
        with self._lock:
            self._log.append(entry)

    def _track(self, connection: socket.socket):
        with self._lock:
            if not self._stopping.is_set():
                self._connections.add(connection)
                return
        _hang_up(connection)  # accepted while stopping

    def _untrack(self, connection: socket.socket):
        with self._lock:
            self._connections.discard(connection)
            self._busy_connections.discard(connection)
            self._idle.notify_all()


def _hang_up(connection: socket.socket):
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Cluster:
    """Fake apiserver instances sharing one object store, like apiservers of different versions on one etcd."""

    def __init__(self, max_events: int = 10_000):
        """`max_events`: how many store events watches can replay from (older resourceVersions get 410)."""
        self.store = Store(max_events)
        self.instances: dict[str, Instance] = {}

    def start(self, name: str, port: int = 0, apiset: "str | dict | ApiSet" = "old", *, aggregated: bool = True,
              accept_v2beta1: bool = False, tls: "ssl.SSLContext | None" = None,
              host: str = "127.0.0.1") -> Instance:
        """Start an instance; port 0 picks a free port. `apiset` is "old", "new", a spec dict or an ApiSet;
        `tls`: serve https with this server context (its verify mode decides whether client certificates
        are asked for; the serial of the one presented is echoed in `x-fake-client-cert-serial`); `host`: the
        address to listen on (another loopback address, e.g. 127.0.0.12, lets instances share a port, as
        apiservers on different nodes share --secure-port)."""
        if name in self.instances and not self.instances[name].stopped:
            raise ValueError(f"instance {name!r} is already running")
        instance = Instance(name, self.store, resolve_apiset(apiset), port, aggregated, accept_v2beta1, tls, host,
                            cluster=self)
        self.instances[name] = instance
        return instance

    def restart(self, name: str, apiset: "str | dict | ApiSet | None" = None, *, aggregated: bool | None = None,
                accept_v2beta1: bool | None = None, tls: "ssl.SSLContext | None" = None) -> Instance:
        """Stop an instance and start it again on the same address and port; unspecified settings are kept."""
        old = self.instances[name]
        old.stop()
        return self.start(name, old.port, old.apiset if apiset is None else apiset,
                          aggregated=old.aggregated if aggregated is None else aggregated,
                          accept_v2beta1=old.accept_v2beta1 if accept_v2beta1 is None else accept_v2beta1,
                          tls=old.tls if tls is None else tls, host=old.host)

    def set_kubernetes_endpoints(self, addresses, port: int, *, not_ready=()) -> dict:
        """Write the EndpointSlice `default/kubernetes` as kube-apiserver v1.36's lease endpoint reconciler does
        (`pkg/controlplane/reconcilers/endpointsadapter.go`; the shape of a real one is
        tests/fixtures/k8s-discovery/endpointslice_kubernetes.k8s-1.36.3.ipv4.json): one endpoint per IP, in
        string order, `ready: true` (false for those in `not_ready`, which the reconciler never writes), the one
        `https` port, an empty list as null. Created the first time, updated (generation + 1) after. Returns
        the stored object."""
        addresses = [str(a) for a in addresses]
        ips = [ipaddress.ip_address(a) for a in addresses]  # ValueError for anything else
        if len({ip.version for ip in ips}) > 1 or not isinstance(port, int) or isinstance(port, bool) \
                or not 0 < port < 65536:
            raise ValueError((addresses, port))
        address_type = "IPv6" if ips and ips[0].version == 6 else "IPv4"
        not_ready = {str(a) for a in not_ready}
        endpoints = [{"addresses": [a], "conditions": {"ready": a not in not_ready}} for a in sorted(set(addresses))]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

        def slice_(uid: str, generation: int, created: str) -> dict:
            # Go's field order; resourceVersion's place is kept, its value set by the store.
            return {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {"name": "kubernetes", "namespace": "default", "uid": uid, "resourceVersion": "",
                                 "generation": generation, "creationTimestamp": created,
                                 "labels": {"kubernetes.io/service-name": "kubernetes"},
                                 "managedFields": [{"manager": "kube-apiserver", "operation": "Update",
                                                    "apiVersion": "discovery.k8s.io/v1", "time": now,
                                                    "fieldsType": "FieldsV1", "fieldsV1": {
                                                        "f:addressType": {}, "f:endpoints": {},
                                                        "f:metadata": {"f:labels": {
                                                            ".": {}, "f:kubernetes.io/service-name": {}}},
                                                        "f:ports": {}}}]},
                    "addressType": address_type, "endpoints": endpoints or None,
                    "ports": [{"name": "https", "protocol": "TCP", "port": port}]}

        def change(current: dict) -> dict:
            meta = current["metadata"]
            return slice_(meta["uid"], meta.get("generation", 1) + 1, meta["creationTimestamp"])

        try:
            return self.store.update(KUBERNETES_SLICE_KEY, change)
        except NotFound:
            try:
                return self.store.create(KUBERNETES_SLICE_KEY, slice_(str(uuid.uuid4()), 1, now))
            except AlreadyExists:  # created meanwhile by another writer: update that one
                return self.store.update(KUBERNETES_SLICE_KEY, change)

    def delete_kubernetes_endpoints(self):
        """Remove the slice, as a cluster whose apiservers run `--endpoint-reconciler-type=none` has none."""
        try:
            self.store.delete(KUBERNETES_SLICE_KEY)
        except NotFound:
            pass

    def stop_all(self):
        for instance in self.instances.values():
            if not instance.stopped:
                instance.stop()
