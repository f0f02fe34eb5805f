"""Renders the Envoy bootstrap for one apiserver and its peers (stdlib only).

One Envoy sits in front of each apiserver. It has a `local` cluster (its own apiserver) and one
`peer-<name>` cluster per peer apiserver, reached directly (not through the peer's Envoy) so a
forwarded request is never forwarded again. The same .wasm runs twice with the same vm_id: as the
singleton discovery service (bootstrap extension) and as the HTTP filter.

    kube-peer-proxy-render --node a --listen 18441 --admin 19441 \
        --local 127.0.0.1:16441 --peer b=127.0.0.1:16442 --peer c=127.0.0.1:16443 \
        --wasm target/kube_peer_proxy.wasm > a.yaml
    kube-peer-proxy-render --demo envoy/demo     # regenerate the committed demo bootstraps (make envoy-configs)

The command is python/pyproject.toml's console script: in .venv/bin (scripts/setup.sh), or wherever
`pip install ./python` puts it. Without installing: `PYTHONPATH=python python3 -m kpp.render` from the
repository root.
"""
import argparse
import json
import pathlib
import sys

ROUTE_HEADER = "x-kube-peer-proxy-cluster"
# Lease mode: the header the address-picked (ORIGINAL_DST) peer cluster reads, set only by the filter.
ADDRESS_HEADER = "x-kube-peer-proxy-peer-address"
LEASE_CLUSTER = "peers-by-address"
# Response header on the replies the filter makes itself (src/wasm/filter.rs): they already are
# Kubernetes Status documents, so the local-reply mapper leaves them alone.
FILTER_REPLY_HEADER = "x-kube-peer-proxy-reply"
VM_ID = "kube-peer-proxy"
FILTER_ROOT_ID = "kube-peer-proxy"
DISCOVERY_ROOT_ID = "kube-peer-proxy-discovery"
PEER_GATE_ROOT_ID = "kube-peer-proxy-peer-gate"  # the peer listener's CN check (src/wasm/peer_gate.rs)
# Label names encoded as `;name=value` in our stat names (src/metrics.rs LABELS).
LABELS = ["code", "group", "version", "resource", "type", "server", "doc"]
# Envoy's tcmalloc keeps freed heap pages resident unless told to give them back (the default
# `bytes_to_release` is 0). The discovery service's answers are buffered whole by Envoy (megabytes
# each with a large API set) and freed a moment later: without a release those pages stay in the
# RSS for good. 16 MiB per second costs nothing measurable on a node whose heap is steady.
MEMORY_RELEASE = {"bytes_to_release": str(16 << 20), "memory_release_interval": "1s"}

# The health paths a load balancer checks (docs/deploy.md "Load balancer"): `/healthz` (kubeadm's HA
# guide checks it) and `/readyz`, with any query, never their sub-checks. Envoy's health_check filter
# answers them 503 once Envoy is failed for health checks (admin /healthcheck/fail: the static pod's
# termination), the filter answers them 503 before its first discovery snapshot (src/request/readiness.rs: the
# same paths), otherwise they reach the local apiserver. `/livez` is always forwarded.
HEALTH_PATH_REGEX = r"^/(healthz|readyz)(\?.*)?$"
# An HTTP/1.0 request without a Host header (HAProxy's `http-check send meth GET uri /healthz`) gets
# this authority, so it routes like any other request; kube-apiserver does not look at it.
HTTP10_DEFAULT_HOST = "kubernetes.default.svc"
# The kubelet's HTTP probes send `User-Agent: kube-probe/<major>.<minor>`. On the client listener only our
# static pod's own readiness probe is expected, and it sends PROBE_HEADER (deploy/static-pod.yaml). Any
# other probe is the kubelet probing kube-apiserver through Envoy (kubeadm's probes moved back to
# <node-ip>:6443, docs/deploy.md "Kubelet probes through the proxy"): the router counts those in this
# virtual cluster (vhost.apiserver.vcluster.kubelet_probe.upstream_rq_total; Envoy config, no wasm). It
# counts requests sent to an apiserver, not the ones Envoy or the filter answer themselves. PROBE_HEADER
# only classifies a probe for that count, never identity, and the route config removes it.
PROBE_HEADER = "x-kube-peer-proxy-probe"
KUBELET_PROBE_VCLUSTER = "kubelet_probe"

# Defaults for the demo and tests; envoy/README.md documents every field.
DEFAULT_PLUGIN = {
    "refresh_interval": "2s",
    "fetch_timeout": "1s",
    "staleness_limit": "15s",
    "retry_after_seconds": 1,
}


# lease_discovery.source of the membership read from the `default/kubernetes` EndpointSlice, which the
# apiservers' lease endpoint reconciler keeps (every version; src/discovery/endpoints.rs).
ENDPOINTS_SOURCE = "kubernetes_endpoints"


def plugin_config(node, peers, overrides=None, leases=None):
    # Lease mode: the peers name this server by its lease's hostname label, so the filter names it the same
    # way (src/config.rs refuses another local_name); `node` then names only Envoy's node. From the
    # kubernetes EndpointSlice every member is named by its IP, this one too.
    local_name = (leases or {}).get("local_hostname") or node
    if (leases or {}).get("source") == ENDPOINTS_SOURCE:
        local_name = _hostport(leases["local_address"])[0].strip("[]")
    cfg = {"local_name": local_name, "local_cluster": "local", "route_header": ROUTE_HEADER}
    if leases is None:
        cfg["peers"] = [{"name": name, "cluster": f"peer-{name}"} for name, _, _ in peers]
    else:
        cfg["lease_discovery"] = {"cluster": LEASE_CLUSTER, "address_header": ADDRESS_HEADER, **leases}
    cfg.update(DEFAULT_PLUGIN)
    cfg.update(overrides or {})
    return cfg


def _upstream_tls(tls_sni, ca=None):
    """TLS to an apiserver. With `ca` the certificate is verified: that CA, and the SAN `tls_sni`
    (every kube-apiserver certificate has `kubernetes.default.svc`); without it Envoy would accept
    any certificate, so only tests against fakes leave it out."""
    ctx = {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
           "sni": tls_sni}
    if ca is not None:
        ctx["common_tls_context"] = {"validation_context": {
            "trusted_ca": {"filename": ca},
            "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": tls_sni}}]}}
    return {"name": "envoy.transport_sockets.tls", "typed_config": ctx}


def _cluster(name, host, port, tls_sni=None, ca=None):
    c = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}]}]},
    }
    if tls_sni is not None:
        c["transport_socket"] = _upstream_tls(tls_sni, ca)
    return c


def _lease_cluster(tls_sni=None, ca=None):
    """The one cluster lease-learned peers are reached through: the filter (and the discovery
    service) pick the destination with ADDRESS_HEADER, only ever an address read from a lease."""
    c = {
        "name": LEASE_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "1s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": ADDRESS_HEADER},
    }
    if tls_sni is not None:
        c["transport_socket"] = _upstream_tls(tls_sni, ca)
    return c


def _wasm_config(name, root_id, configuration, wasm_path):
    return {
        "name": name,
        "root_id": root_id,
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                          "value": configuration},
        "vm_config": {"vm_id": VM_ID, "runtime": "envoy.wasm.runtime.v8",
                      "code": {"local": {"filename": wasm_path}}},
    }


def render_bootstrap(*, node, listen_port, admin_port, local, peers, wasm_path, plugin=None,
                     filter_plugin=None, failure_policy="FAIL_RELOAD", with_filter=True,
                     upstream_tls_sni=None, upstream_ca=None, leases=None, listen_address="127.0.0.1"):
    """Returns the bootstrap as YAML text (JSON is valid YAML).

    leases: lease mode instead of `peers` (which must then be empty): the plugin's
    `lease_discovery` fields besides cluster and address header, e.g. {"local_hostname": "cp-1"};
    plugin: overrides for the plugin configuration of both the service and the filter;
    filter_plugin: a raw configuration string for the filter only (tests of config rejection);
    with_filter=False renders plain Envoy (the control case without the filter).
    """
    if leases is not None and peers:
        raise ValueError("lease mode and configured peers are exclusive")
    plugin_cfg = plugin_config(node, peers, plugin, leases)
    retry_after = plugin_cfg.get("retry_after_seconds", 1)
    unavailable_status = {
        "headers_to_add": [{"header": {"key": "retry-after", "value": str(retry_after)},
                            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
        "body_format_override": {"json_format": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "%LOCAL_REPLY_BODY%", "reason": "ServiceUnavailable", "code": 503,
            "details": {"retryAfterSeconds": retry_after}}},
    }
    cfg = json.dumps(plugin_cfg, separators=(",", ":"))
    # First, so that a health check of a draining Envoy is answered 503 before anything else runs;
    # pass-through: otherwise the request goes on (to the filter, then the local apiserver).
    http_filters = [{"name": "envoy.filters.http.health_check", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck",
        "pass_through_mode": True,
        "headers": [{"name": ":path", "string_match": {"safe_regex": {"regex": HEALTH_PATH_REGEX}}}]}}]
    if with_filter:
        wasm = _wasm_config("kube-peer-proxy", FILTER_ROOT_ID,
                            filter_plugin if filter_plugin is not None else cfg, wasm_path)
        wasm["failure_policy"] = failure_policy
        http_filters.append({"name": "envoy.filters.http.wasm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", "config": wasm}})
    http_filters.append({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})

    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "apiserver",
        "codec_type": "AUTO",
        # HTTP/1.0 as kube-apiserver accepts it (load balancers' health checks speak it); Envoy's
        # default answers it 426. The header stripping and routing below do not depend on the version.
        "http_protocol_options": {"accept_http_10": True, "default_host_for_http_10": HTTP10_DEFAULT_HOST},
        # The apiserver sees exactly the path the client sent, as it would without Envoy, so the
        # filter's RequestInfo and the apiserver's agree (no normalization, no slash merging).
        "normalize_path": False,
        # Envoy's default, stated so the limit is visible: larger request headers get a 431.
        "max_request_headers_kb": 60,
        "merge_slashes": False,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        # Watches and exec streams are long-lived; the apiserver bounds them itself.
        "stream_idle_timeout": "0s",
        "request_timeout": "0s",
        "upgrade_configs": [{"upgrade_type": "websocket"}, {"upgrade_type": "SPDY/3.1"}],
        # When Envoy cannot reach an apiserver it answers itself; make that answer what Kubernetes
        # clients expect (a Status with Retry-After), not plain text.
        # The second mapper catches Envoy's other 503s, e.g. a request whose wasm VM just failed
        # (`wasm_fail_stream`, no response flag); the filter marks its own 503s, which already
        # are Status documents, with a response header (a CEL filter: the plain header filter
        # reads request headers, which the filter cannot change once the request went upstream).
        "local_reply_config": {"mappers": [
            {"filter": {"response_flag_filter": {"flags": ["UF", "UH", "UO", "URX", "UC"]}},
             **unavailable_status},
            {"filter": {"and_filter": {"filters": [
                {"status_code_filter": {"comparison": {"op": "EQ", "value": {
                    "default_value": 503, "runtime_key": "kube_peer_proxy.local_reply_503"}}}},
                {"extension_filter": {
                    "name": "envoy.access_loggers.extension_filters.cel",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                        "expression": f"!('{FILTER_REPLY_HEADER}' in response.headers)"}}},
             ]}}, **unavailable_status},
        ]},
        "route_config": {
            "name": "apiserver",
            # The routing and address headers are removed from every client request before any
            # filter runs (no address is "internal" by Envoy 1.40's default), so even a failed-open
            # VM cannot let a client pick a cluster or an upstream address.
            "internal_only_headers": [ROUTE_HEADER, ADDRESS_HEADER],
            # Removed by the router after it chose the virtual cluster: no apiserver sees it.
            "request_headers_to_remove": [PROBE_HEADER],
            "virtual_hosts": [{
            "name": "apiserver", "domains": ["*"],
            "virtual_clusters": [{"name": KUBELET_PROBE_VCLUSTER, "headers": [
                {"name": "user-agent", "string_match": {"prefix": "kube-probe/"}},
                {"name": PROBE_HEADER, "present_match": False}]}],
            "routes": [
                {"match": {"prefix": "/", "headers": [{"name": ROUTE_HEADER, "present_match": True}]},
                 "route": {"cluster_header": ROUTE_HEADER, "timeout": "0s"}},
                {"match": {"prefix": "/"}, "route": {"cluster": "local", "timeout": "0s"}},
            ]}]},
        "http_filters": http_filters,
    }
    local_host, local_port = local
    clusters = [_cluster("local", local_host, local_port, upstream_tls_sni, upstream_ca)]
    clusters += [_cluster(f"peer-{name}", host, port, upstream_tls_sni, upstream_ca) for name, host, port in peers]
    if leases is not None:
        clusters.append(_lease_cluster(upstream_tls_sni, upstream_ca))

    bootstrap = {
        "node": {"id": f"kube-peer-proxy-{node}", "cluster": "kube-peer-proxy"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "stats_config": {"stats_tags": [
            {"tag_name": label, "regex": f"(;{label}=([^;]*))"} for label in LABELS]},
        "memory_allocator_manager": MEMORY_RELEASE,
        "static_resources": {
            "listeners": [{
                "name": "apiserver",
                "address": {"socket_address": {"address": listen_address, "port_value": listen_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
            }],
            "clusters": clusters,
        },
    }
    if with_filter:
        bootstrap["bootstrap_extensions"] = [{"name": "envoy.bootstrap.wasm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
            "singleton": True,
            "config": _wasm_config("kube-peer-proxy-discovery", DISCOVERY_ROOT_ID, cfg, wasm_path)}}]
    return json.dumps(bootstrap, indent=2) + "\n"


# ---- kubeadm control-plane node profile ---------------------------------------------------------
# Envoy owns <node-ip>:6443 (what the `kubernetes` Service endpoints and every kubeadm kubeconfig
# point at), the apiserver moves to 127.0.0.1:6443, and peers reach each other through a dedicated
# peer listener (<node-ip>:6444) that only accepts the front-proxy CA. docs/deploy.md explains why.

# kubeadm's --requestheader-* defaults (cmd/kubeadm/app/phases/controlplane/manifests.go).
KUBEADM_REQUESTHEADER = {"username_headers": ["x-remote-user"], "uid_headers": [],
                         "group_headers": ["x-remote-group"], "extra_headers_prefixes": ["x-remote-extra-"]}
# Who the proxy's own requests (discovery, lease list, the 404 guard's questions) are, asserted with the
# front-proxy client certificate; RBAC in deploy/rbac.yaml.
DISCOVERY_USER = "system:kube-peer-proxy"
# The certless twin of the local cluster (requests without an asserted identity).
ANON_SUFFIX = "-anon"
KUBEADM_SNI = "kubernetes.default.svc"
# Every client copy of a header with this prefix is removed (src/request/identity.rs REMOTE_PREFIX).
REMOTE_PREFIX = "x-remote-"


# Renewed PKI files are picked up while Envoy runs (docs/deploy.md "Certificate renewal"). Every PKI
# file reaches Envoy as a file-based SDS secret (static secrets are never re-read). Envoy re-reads an
# SDS secret's files only when something is renamed into its watched directory, and kubeadm (like cp)
# rewrites them in place, so the static pod's pki-reload container renames a marker into RELOAD_DIR
# whenever a PKI file changes (deploy/static-pod.yaml). Envoy then loads the new set if it is whole
# and consistent, and otherwise keeps the last good one and counts sds.<secret>.key_rotation_failed.
KUBEADM_DIR = "/etc/kubernetes/kube-peer-proxy"
KUBEADM_SDS_DIR = f"{KUBEADM_DIR}/sds"
RELOAD_DIR = "/run/kube-peer-proxy/reload"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
# secret name -> the PKI files it is made of (the pki-reload container watches exactly these).
KUBEADM_SECRETS = {
    "serving": ("apiserver.crt", "apiserver.key"),
    "front-proxy-client": ("front-proxy-client.crt", "front-proxy-client.key"),
    "cluster-ca": ("ca.crt",),
    "front-proxy-ca": ("front-proxy-ca.crt",),
}


def kubeadm_sds_files(pki, reload_dir=RELOAD_DIR):
    """{file name: text} of the SDS secret files the kubeadm bootstrap reads (one secret a file:
    Envoy's filesystem SDS takes exactly one resource per file)."""
    watch = {"watched_directory": {"path": str(reload_dir)}}
    bodies = {}
    for name, files in KUBEADM_SECRETS.items():
        if len(files) == 2:
            body = {"tls_certificate": {"certificate_chain": {"filename": f"{pki}/{files[0]}"},
                                        "private_key": {"filename": f"{pki}/{files[1]}"}, **watch}}
        else:
            body = {"validation_context": {"trusted_ca": {"filename": f"{pki}/{files[0]}"}, **watch}}
        bodies[f"{name}.yaml"] = json.dumps(
            {"resources": [{"@type": SECRET_TYPE, "name": name, **body}]}, indent=2) + "\n"
    return bodies


def write_kubeadm_sds(sds_dir, pki, reload_dir=RELOAD_DIR):
    """Writes kubeadm_sds_files into sds_dir (created if needed); returns it as a Path."""
    d = pathlib.Path(sds_dir)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in kubeadm_sds_files(pki, reload_dir).items():
        (d / name).write_text(text)
    return d


def _sds(name, sds_dir):
    return {"name": name, "sds_config": {"path_config_source": {"path": f"{sds_dir}/{name}.yaml"},
                                         "resource_api_version": "V3"}}


def _tls_upstream(sds_dir, sni=KUBEADM_SNI, client_certificate=True):
    """Upstream TLS: the apiserver's certificate verified (cluster CA + a SAN every kubeadm apiserver
    certificate has), and the front-proxy client certificate presented (unless certless)."""
    ctx = {"combined_validation_context": {
        "default_validation_context": {
            "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": sni}}]},
        "validation_context_sds_secret_config": _sds("cluster-ca", sds_dir)}}
    if client_certificate:
        ctx["tls_certificate_sds_secret_configs"] = [_sds("front-proxy-client", sds_dir)]
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "sni": sni, "common_tls_context": ctx}}


def _tls_downstream(sds_dir, client_ca_secret, require_client_certificate):
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "require_client_certificate": require_client_certificate,
        "common_tls_context": {
            "tls_certificate_sds_secret_configs": [_sds("serving", sds_dir)],
            "validation_context_sds_secret_config": _sds(client_ca_secret, sds_dir),
            "alpn_protocols": ["h2", "http/1.1"]}}}


def _strip_headers(names, prefixes):
    """Early header mutation: runs before every filter and before routing, so a failed or bypassed
    filter cannot forward a client's copy of these headers."""
    mutations = [{"remove": n} for n in names]
    mutations += [{"remove_on_match": {"key_matcher": {"prefix": p, "ignore_case": True}}} for p in prefixes]
    return [{"name": "envoy.http.early_header_mutation.header_mutation", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
        "mutations": mutations}}]


def _access_log(path):
    return [{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
        "path": path,
        "log_format": {"json_format": {
            "start": "%START_TIME%", "method": "%REQ(:METHOD)%", "path": "%REQ(:PATH)%",
            "code": "%RESPONSE_CODE%", "flags": "%RESPONSE_FLAGS%", "cluster": "%UPSTREAM_CLUSTER%",
            "upstream_host": "%UPSTREAM_HOST%", "peer_proxied": "%REQ(X-KUBERNETES-PEER-PROXIED)%",
            "audit_id": "%REQ(AUDIT-ID)%", "client": "%DOWNSTREAM_REMOTE_ADDRESS%",
            "user": "%REQ(X-REMOTE-USER)%", "duration_ms": "%DURATION%",
            # the client certificate's serial: on the peer listener, which proxy's certificate
            "peer_serial": "%DOWNSTREAM_PEER_SERIAL%",
            # the apiserver's audit ID of this request (its Audit-Id response header): one audit event,
            # one access-log line; and which listener (6443 clients, 6444 peers) took it
            "resp_audit_id": "%RESP(AUDIT-ID)%", "listener_port": "%DOWNSTREAM_LOCAL_PORT%"}}}}]


def render_kubeadm(*, node, node_ip, apiserver, wasm_path, peers=None, leases=None, lease_hosts=None,
                   endpoints=False, admin_port=9901, port=6443, peer_port=6444, access_log=None, requestheader=None,
                   plugin=None, peer_allowed_names=("front-proxy-client",), sds_dir=KUBEADM_SDS_DIR):
    """The bootstrap of one kubeadm control-plane node (JSON text).

    apiserver: (host, port) the local kube-apiserver now binds (127.0.0.1:6443 on a real node);
    sds_dir: where the node's SDS secret files are (write_kubeadm_sds writes them; they name the
    kubeadm PKI files, /etc/kubernetes/pki on a real node); peers: [(name, node_ip)] of the other
    control-plane nodes, reached at their peer listener; or leases: lease mode, the plugin's
    `lease_discovery` fields, e.g. {"local_hostname": "cp-1"} (the node's hostname: its apiserver's
    identity lease label; every control-plane node needs a distinct one). kube-apiserver writes its
    lease's `kubernetes.io/peer-advertise-address` from --advertise-address and --secure-port
    (1.36; --peer-advertise-ip/port do not reach it), i.e. <node-ip>:6443, Envoy's client listener:
    lease mode reaches that host at `peer_port` instead (`lease_discovery.peer_port`, set here; a
    key set to None is left out, e.g. {"peer_port": None} keeps the advertised port). lease_hosts:
    [(hostname, node_ip)] of nodes whose apiserver writes no annotation (1.35 and older with
    default feature gates), reached at <node-ip>:<peer_port>. endpoints: the members are the addresses
    of the `default/kubernetes` EndpointSlice (every kube-apiserver version writes its
    --advertise-address there, <node-ip>:6443), reached at <ip>:<peer_port>; this node is the one at
    <node_ip>:<port>. Neither peers, leases nor endpoints: a single control-plane node, no peers.
    """
    if endpoints:
        if leases is not None or peers or lease_hosts:
            raise ValueError("endpoints membership excludes peers, leases and lease_hosts")
        leases = {"source": ENDPOINTS_SOURCE, "local_address": f"{node_ip}:{port}"}
    if leases is not None:
        hosts = {h: f"{ip}:{peer_port}" for h, ip in (lease_hosts or [])}
        leases = {"peer_port": peer_port, **({"hosts": hosts} if hosts else {}), **leases}
        leases = {k: v for k, v in leases.items() if v is not None}
    elif lease_hosts:
        raise ValueError("lease_hosts needs lease mode (leases)")
    rh = dict(requestheader or KUBEADM_REQUESTHEADER)
    user_header = rh["username_headers"][0]
    cfg = {"client_identity": rh,
           "discovery_headers": {user_header: DISCOVERY_USER},
           "refresh_interval": "2s", "fetch_timeout": "2s", "staleness_limit": "15s"}
    cfg.update(plugin or {})
    text = render_bootstrap(
        node=node, listen_port=port, admin_port=admin_port, local=apiserver,
        peers=[] if leases is not None else [(n, ip, peer_port) for n, ip in (peers or [])],
        wasm_path=wasm_path, plugin=cfg, upstream_tls_sni=KUBEADM_SNI, leases=leases, listen_address=node_ip)
    b = json.loads(text)
    clusters = b["static_resources"]["clusters"]
    for c in clusters:
        c["transport_socket"] = _tls_upstream(sds_dir)
    # The local apiserver's certless twin: a request the proxy asserts no identity for (a bearer
    # token, or anonymous) must reach it without the front-proxy certificate, else its x509
    # authenticator fails on that certificate and an anonymous request gets 401 instead of being
    # system:anonymous. Peers always get the certificate: their peer listener requires it and
    # makes the same choice for its own apiserver.
    twin = json.loads(json.dumps(next(c for c in clusters if c["name"] == "local")))
    twin["name"] = twin["load_assignment"]["cluster_name"] = "local" + ANON_SUFFIX
    twin["transport_socket"] = _tls_upstream(sds_dir, client_certificate=False)
    clusters.append(twin)
    listener = b["static_resources"]["listeners"][0]
    chain = listener["filter_chains"][0]
    chain["transport_socket"] = _tls_downstream(sds_dir, "cluster-ca", False)
    hcm = chain["filters"][0]["typed_config"]
    identity = rh["username_headers"] + rh["uid_headers"] + rh["group_headers"]
    # The whole X-Remote- family goes, whatever the apiservers' flags name (X-Remote-Uid included), and
    # X-Real-Ip, which kube-apiserver would put into the audit log's sourceIPs.
    hcm["early_header_mutation_extensions"] = _strip_headers(
        identity + [ROUTE_HEADER, ADDRESS_HEADER, "x-forwarded-for", "x-real-ip"],
        sorted(set(rh["extra_headers_prefixes"]) | {REMOTE_PREFIX}))
    # X-Forwarded-For is the client's address, from the connection: audit's sourceIPs show the client.
    hcm["use_remote_address"] = True
    # Route 1 (a peer the filter chose) stays; local requests go to `local` when the filter
    # asserted an identity, else to the certless twin.
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    routes[1:] = [
        {"match": {"prefix": "/", "headers": [{"name": user_header, "present_match": True}]},
         "route": {"cluster": "local", "timeout": "0s"}},
        {"match": {"prefix": "/"}, "route": {"cluster": "local" + ANON_SUFFIX, "timeout": "0s"}},
    ]
    hcm["http2_protocol_options"] = {"allow_connect": True}
    if access_log:
        hcm["access_log"] = _access_log(access_log)
    # The peer listener: other nodes' proxies only (front-proxy CA, allowed names), straight to the
    # local apiserver with the identity the sending proxy asserted; never forwarded again.
    peer_hcm = {
        "@type": hcm["@type"], "stat_prefix": "peers", "codec_type": "AUTO",
        "normalize_path": False, "merge_slashes": False, "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        "stream_idle_timeout": "0s", "request_timeout": "0s",
        "upgrade_configs": [{"upgrade_type": "websocket"}, {"upgrade_type": "SPDY/3.1"}],
        "early_header_mutation_extensions": _strip_headers([ROUTE_HEADER, ADDRESS_HEADER], []),
        "route_config": {"name": "peers", "virtual_hosts": [{"name": "local", "domains": ["*"], "routes": [
            {"match": {"prefix": "/", "headers": [{"name": user_header, "present_match": True}]},
             "route": {"cluster": "local", "timeout": "0s"}},
            {"match": {"prefix": "/"}, "route": {"cluster": "local" + ANON_SUFFIX, "timeout": "0s"}}]}]},
        "http_filters": [
            # A verified client certificate is required (the TLS context), and its subject CN must be
            # an allowed name, exactly as kube-apiserver's --requestheader-allowed-names checks it: the
            # wasm gate. (Envoy's RBAC principal_name cannot: it matches a URI or DNS SAN first.)
            # FAIL_CLOSED: a gate that cannot run refuses.
            {"name": "envoy.filters.http.wasm", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": {**_wasm_config("kube-peer-proxy-peer-gate", PEER_GATE_ROOT_ID,
                                          json.dumps({"allowed_names": list(peer_allowed_names)}), wasm_path),
                           "failure_policy": "FAIL_CLOSED"}}},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    if access_log:
        peer_hcm["access_log"] = _access_log(access_log)
    b["static_resources"]["listeners"].append({
        "name": "peers",
        "address": {"socket_address": {"address": node_ip, "port_value": peer_port}},
        "filter_chains": [{"transport_socket": _tls_downstream(sds_dir, "front-proxy-ca", True),
                           "filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": peer_hcm}]}]})
    return json.dumps(b, indent=2) + "\n"


# The `make run` demo: apiserver a is old (1.33 API set), b and c are new (1.37-dev set).
DEMO_WASM = "target/kube_peer_proxy.wasm"
DEMO_SERVERS = {"a": 16441, "b": 16442, "c": 16443}
DEMO_ENVOY_PORTS = {"a": (18441, 19441), "b": (18442, 19442), "c": (18443, 19443)}


def demo_bootstraps(wasm_path=DEMO_WASM):
    """The committed envoy/demo/apiserver-<name>.yaml files (wasm path relative to the repo root)."""
    out = {}
    for node, (listen, admin) in DEMO_ENVOY_PORTS.items():
        peers = [(n, "127.0.0.1", p) for n, p in DEMO_SERVERS.items() if n != node]
        out[f"apiserver-{node}"] = render_bootstrap(
            node=node, listen_port=listen, admin_port=admin, local=("127.0.0.1", DEMO_SERVERS[node]),
            peers=peers, wasm_path=wasm_path)
    return out


def _hostport(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--demo"]:
        out = pathlib.Path(argv[1] if len(argv) > 1 else "envoy/demo")
        out.mkdir(parents=True, exist_ok=True)
        for name, text in demo_bootstraps().items():
            (out / f"{name}.yaml").write_text(text)
        return
    if "--kubeadm" in argv:
        return _main_kubeadm(argv)
    p = argparse.ArgumentParser(prog="kube-peer-proxy-render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Two profiles: this plain one (loopback, tests and the demo), and the kubeadm "
                                       "control-plane profile: `kube-peer-proxy-render --kubeadm PKI_DIR --help` lists "
                                       "its options (docs/deploy.md). `--demo [DIR]` writes the demo's bootstraps.")
    p.add_argument("--kubeadm", metavar="PKI_DIR",
                   help="render the kubeadm control-plane profile instead (its own options: --kubeadm PKI_DIR --help)")
    p.add_argument("--node", required=True, help="this apiserver's name (metrics, logs, merged discovery order; "
                                                 "in lease mode the filter uses --lease-local-hostname, as the peers do)")
    p.add_argument("--listen", type=int, required=True, help="Envoy's listener port (127.0.0.1)")
    p.add_argument("--admin", type=int, required=True, help="Envoy's admin port (127.0.0.1)")
    p.add_argument("--local", required=True, help="host:port of the local apiserver")
    p.add_argument("--peer", action="append", default=[], help="name=host:port (repeatable)")
    p.add_argument("--wasm", required=True, help="path of the kube-peer-proxy .wasm as Envoy sees it")
    p.add_argument("--plugin-json", default=None, help="JSON object of plugin config overrides")
    p.add_argument("--upstream-tls-sni", default=None, help="TLS to the apiservers with this SNI (and SAN)")
    p.add_argument("--upstream-ca", default=None,
                   help="verify the apiservers' certificates with this CA and the SNI as SAN (always do on real clusters)")
    p.add_argument("--lease-local-hostname", default=None,
                   help="lease mode: peers from apiserver identity leases; this node's kubernetes.io/hostname")
    a = p.parse_args(argv)
    peers = []
    for spec in a.peer:
        name, _, hp = spec.partition("=")
        peers.append((name, *_hostport(hp)))
    sys.stdout.write(render_bootstrap(
        node=a.node, listen_port=a.listen, admin_port=a.admin, local=_hostport(a.local), peers=peers,
        wasm_path=a.wasm, plugin=json.loads(a.plugin_json) if a.plugin_json else None,
        upstream_tls_sni=a.upstream_tls_sni, upstream_ca=a.upstream_ca,
        leases={"local_hostname": a.lease_local_hostname} if a.lease_local_hostname else None))


def _main_kubeadm(argv):
    """`--kubeadm PKI_DIR`: the bootstrap of one kubeadm control-plane node (docs/deploy.md)."""
    p = argparse.ArgumentParser(
        prog="kube-peer-proxy-render --kubeadm", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="The kubeadm control-plane profile (docs/deploy.md): Envoy on <node-ip>:6443 for clients and "
                    "<node-ip>:<peer-port> for the other nodes' proxies, in front of the kube-apiserver moved to "
                    "127.0.0.1:6443. Peers, by default: every address of the `default/kubernetes` EndpointSlice, "
                    "which every kube-apiserver version keeps (its --advertise-address, the node IP); or one --peer "
                    "per other control-plane node; or lease mode (--lease-local-hostname: peers from the apiservers' "
                    "identity leases; every node needs a distinct hostname); --no-peers: a single control-plane node.")
    p.add_argument("--kubeadm", required=True, metavar="PKI_DIR", help="kubeadm PKI directory (/etc/kubernetes/pki)")
    p.add_argument("--node", required=True, help="this node's name (metrics, logs, merged discovery order; in lease "
                                                 "mode the filter uses --lease-local-hostname, as the other nodes do)")
    p.add_argument("--node-ip", required=True, help="the node's address: Envoy takes :6443 and the peer port there")
    p.add_argument("--apiserver", default="127.0.0.1:6443", help="where the local kube-apiserver now binds")
    p.add_argument("--peer", action="append", default=[],
                   help="name=node-ip of another control-plane node (repeat per node; the same names on every node)")
    p.add_argument("--lease-local-hostname", default=None,
                   help="lease mode: this node's hostname (the kubernetes.io/hostname label of its apiserver's "
                        "identity lease; every control-plane node needs a distinct one). Peers are found from the "
                        "leases and reached at the advertised host on --peer-port; no apiserver flag is needed")
    p.add_argument("--lease-host", action="append", default=[], metavar="HOSTNAME=NODE_IP",
                   help="lease mode: a node whose apiserver writes no peer-advertise-address annotation (1.35 and "
                        "older with default feature gates), reached at NODE_IP:<peer-port> (repeatable)")
    p.add_argument("--no-peers", action="store_true",
                   help="a single control-plane node: no peers and no membership reads")
    p.add_argument("--peer-port", type=int, default=6444,
                   help="the peer listener's port, on this node and on every peer")
    p.add_argument("--wasm", required=True, help="path of the kube-peer-proxy .wasm as Envoy sees it")
    p.add_argument("--admin-port", type=int, default=9901, help="Envoy's admin port, on 127.0.0.1 only")
    p.add_argument("--access-log", default=None, help="write a JSON access log of both listeners to this file")
    p.add_argument("--uid-header", default=None,
                   help="assert client certificates' user UID in this header: only when every apiserver runs with "
                        "--requestheader-uid-headers naming it (kubeadm sets none; without it a certificate that "
                        "carries a UID is refused, never forwarded without its UID)")
    p.add_argument("--sds-dir", default=KUBEADM_SDS_DIR,
                   help="where the bootstrap reads its TLS secrets (SDS files naming the PKI files)")
    p.add_argument("--write-sds", action="store_true",
                   help="also write the SDS files into --sds-dir (on the node; they name PKI_DIR's files)")
    a = p.parse_args(argv)
    if a.peer and a.lease_local_hostname:
        p.error("give --peer for each other node, or --lease-local-hostname (lease mode), not both")
    if a.lease_host and not a.lease_local_hostname:
        p.error("--lease-host is for lease mode: give --lease-local-hostname too")
    if a.no_peers and (a.peer or a.lease_local_hostname):
        p.error("--no-peers excludes --peer and --lease-local-hostname")
    text = render_kubeadm(
        node=a.node, node_ip=a.node_ip, apiserver=_hostport(a.apiserver), wasm_path=a.wasm,
        peers=[tuple(x.split("=", 1)) for x in a.peer] or None,
        endpoints=not (a.no_peers or a.peer or a.lease_local_hostname),
        leases={"local_hostname": a.lease_local_hostname} if a.lease_local_hostname else None,
        lease_hosts=[tuple(x.split("=", 1)) for x in a.lease_host] or None,
        admin_port=a.admin_port, access_log=a.access_log, sds_dir=a.sds_dir, peer_port=a.peer_port,
        requestheader={**KUBEADM_REQUESTHEADER, "uid_headers": [a.uid_header.lower()]} if a.uid_header else None)
    if a.write_sds:
        d = write_kubeadm_sds(a.sds_dir, a.kubeadm)
        print(f"wrote {len(KUBEADM_SECRETS)} SDS secret files to {d}", file=sys.stderr)
    sys.stdout.write(text)


if __name__ == "__main__":
    sys.exit(main())
