//! Plugin configuration: JSON parsed with serde, then validated field by field into [`Config`].
//! Every error names the offending field (e.g. `peers[1].cluster: missing`), because Envoy shows
//! only our log line when it refuses the filter.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::snapshot::MAX_SERVERS;

/// Root id of the singleton discovery service (the HTTP filter uses any other root id).
pub const DISCOVERY_ROOT_ID: &str = "kube-peer-proxy-discovery";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub cluster: String,
}

/// Where lease mode learns its members (`lease_discovery.source`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MembershipSource {
    /// The `kube-system` identity leases (`"identity_leases"`, the default): addresses from their
    /// annotation (v1.36+) or `hosts`.
    #[default]
    IdentityLeases,
    /// The EndpointSlice `default/kubernetes` that every kube-apiserver's lease endpoint reconciler
    /// keeps (`"kubernetes_endpoints"`): live advertise addresses on any version, no per-node list.
    KubernetesEndpoints,
}

impl MembershipSource {
    /// The configuration value.
    pub fn as_str(self) -> &'static str {
        match self {
            MembershipSource::IdentityLeases => "identity_leases",
            MembershipSource::KubernetesEndpoints => "kubernetes_endpoints",
        }
    }

    fn parse(s: &str) -> Option<MembershipSource> {
        [MembershipSource::IdentityLeases, MembershipSource::KubernetesEndpoints]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// Lease mode: peers are the apiservers whose identity leases are live (upstream's peer discovery,
/// `staging/src/k8s.io/apiserver/pkg/util/peerproxy/peer_discovery.go`), reached through one
/// address-picked cluster instead of one configured cluster each; or the servers the EndpointSlice
/// `default/kubernetes` lists ([`MembershipSource::KubernetesEndpoints`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseDiscovery {
    /// What the members are read from.
    pub source: MembershipSource,
    /// An Envoy `ORIGINAL_DST` cluster that takes its destination from `address_header`.
    pub cluster: String,
    /// The header that cluster reads (`original_dst_lb_config.http_header_name`). Only the filter
    /// sets it, only to addresses learned from leases; clients' copies are stripped.
    pub address_header: String,
    /// What identifies the local apiserver's own lease (by its `kubernetes.io/hostname` label or
    /// its advertised address); at least one is required. From the EndpointSlice only the
    /// address's IP (required), since the slice lists IPs.
    pub local_hostname: Option<String>,
    pub local_address: Option<String>,
    /// `hostname → ip:port` for servers that do not write the peer-advertise-address annotation.
    pub hosts: Vec<(String, String)>,
    /// Reach a peer at its annotation's host on this port instead of the advertised port, which
    /// kube-apiserver always fills from `--secure-port` (in kubeadm's layout, Envoy's client
    /// listener); `None` keeps the advertised port (the slice's `https` port from the EndpointSlice).
    pub peer_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Name of the local apiserver in metrics, logs and merged discovery's name order. In lease
    /// mode with `local_hostname` it is that hostname (what the peers call this server); with the
    /// EndpointSlice, `local_address`'s IP.
    pub local_name: String,
    /// Envoy cluster of the local apiserver (the route's default cluster).
    pub local_cluster: String,
    pub peers: Vec<Peer>,
    /// Header the route's `cluster_header` reads; clients can never set it.
    pub route_header: String,
    pub refresh_interval: Duration,
    pub fetch_timeout: Duration,
    /// A server that has not answered discovery for this long is dropped from routing.
    pub staleness_limit: Duration,
    pub retry_after_seconds: u32,
    /// `:authority` of discovery fetches.
    pub discovery_authority: String,
    /// Extra headers on discovery fetches (e.g. `authorization` for real apiservers).
    pub discovery_headers: Vec<(String, String)>,
    pub max_discovery_bytes: usize,
    /// Answer aggregated `/apis` and `/api` with the union of every member's last-known APIs.
    pub merged_discovery: bool,
    /// Peers from identity leases (or the EndpointSlice `default/kubernetes`) instead of `peers`.
    pub lease_discovery: Option<LeaseDiscovery>,
    /// Assert verified client certificates' identity to the apiservers in these request headers
    /// (the apiservers' `--requestheader-*` names); clients' copies of them are always removed.
    pub client_identity: Option<crate::request::identity::RequestHeaderNames>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            local_name: "local".into(),
            local_cluster: String::new(),
            peers: Vec::new(),
            route_header: "x-kube-peer-proxy-cluster".into(),
            refresh_interval: Duration::from_secs(5),
            fetch_timeout: Duration::from_secs(2),
            staleness_limit: Duration::from_secs(30),
            retry_after_seconds: 1,
            discovery_authority: "kubernetes.default.svc".into(),
            discovery_headers: Vec::new(),
            max_discovery_bytes: 16 << 20,
            merged_discovery: true,
            lease_discovery: None,
            client_identity: None,
        }
    }
}

/// Every top-level field `parse` accepts (envoy/README.md documents each: `tests/config_doc.rs`).
pub const FIELDS: &[&str] = &[
    "local_name",
    "local_cluster",
    "peers",
    "route_header",
    "refresh_interval",
    "fetch_timeout",
    "staleness_limit",
    "retry_after_seconds",
    "discovery_authority",
    "discovery_headers",
    "max_discovery_bytes",
    "merged_discovery",
    "lease_discovery",
    "client_identity",
];

/// The fields of `client_identity`.
pub const IDENTITY_FIELDS: &[&str] = &[
    "username_headers",
    "uid_headers",
    "group_headers",
    "extra_headers_prefixes",
];

/// The fields of `lease_discovery`.
pub const LEASE_FIELDS: &[&str] = &[
    "source",
    "cluster",
    "address_header",
    "local_hostname",
    "local_address",
    "hosts",
    "peer_port",
];

impl Config {
    pub fn parse(bytes: &[u8]) -> Result<Config, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("configuration: invalid JSON: {e}"))?;
        let obj = v.as_object().ok_or("configuration: expected a JSON object")?;
        for k in obj.keys() {
            if !FIELDS.contains(&k.as_str()) {
                return Err(format!("{k}: unknown field (known: {})", FIELDS.join(", ")));
            }
        }
        let mut c = Config {
            local_cluster: string(obj, "local_cluster")?.ok_or("local_cluster: missing")?,
            ..Config::default()
        };
        non_empty("local_cluster", &c.local_cluster)?;
        if let Some(n) = string(obj, "local_name")? {
            non_empty("local_name", &n)?;
            c.local_name = n;
        }
        if let Some(h) = string(obj, "route_header")? {
            if h.is_empty() || h.starts_with(':') || !h.bytes().all(is_header_char) {
                return Err(format!("route_header: {h:?} is not a valid lower-case header name"));
            }
            c.route_header = h;
        }
        if let Some(d) = duration(obj, "refresh_interval")? {
            c.refresh_interval = d;
        }
        if let Some(d) = duration(obj, "fetch_timeout")? {
            c.fetch_timeout = d;
        }
        if let Some(d) = duration(obj, "staleness_limit")? {
            c.staleness_limit = d;
        }
        if c.staleness_limit < c.refresh_interval {
            return Err("staleness_limit: must be at least refresh_interval".into());
        }
        if let Some(n) = positive_int(obj, "retry_after_seconds")? {
            c.retry_after_seconds = u32::try_from(n).map_err(|_| "retry_after_seconds: too large")?;
        }
        if let Some(a) = string(obj, "discovery_authority")? {
            non_empty("discovery_authority", &a)?;
            c.discovery_authority = a;
        }
        if let Some(n) = positive_int(obj, "max_discovery_bytes")? {
            c.max_discovery_bytes = usize::try_from(n).map_err(|_| "max_discovery_bytes: too large")?;
        }
        match obj.get("merged_discovery") {
            None => {}
            Some(Value::Bool(b)) => c.merged_discovery = *b,
            Some(other) => return Err(format!("merged_discovery: expected a boolean, got {}", kind(other))),
        }
        if let Some(h) = obj.get("discovery_headers") {
            let map = h
                .as_object()
                .ok_or_else(|| format!("discovery_headers: expected an object, got {}", kind(h)))?;
            for (k, v) in map {
                let field = format!("discovery_headers.{k}");
                let val = v
                    .as_str()
                    .ok_or_else(|| format!("{field}: expected a string, got {}", kind(v)))?;
                if k.is_empty() || k.starts_with(':') || !k.bytes().all(is_header_char) {
                    return Err(format!("{field}: not a valid lower-case header name"));
                }
                c.discovery_headers.push((k.clone(), val.to_string()));
            }
        }
        c.peers = peers(obj, &c)?;
        c.lease_discovery = lease_discovery(obj, &c)?;
        // From the EndpointSlice every peer is named by its IP, so the other nodes name this server
        // by local_address's IP: local_name must be that, for the same reasons as below.
        if let Some(ip) = c
            .lease_discovery
            .as_ref()
            .and_then(LeaseDiscovery::endpoints_local_name)
        {
            match obj.get("local_name") {
                None => c.local_name = ip,
                Some(_) if c.local_name == ip => {}
                Some(_) => {
                    return Err(format!(
                        "local_name: {:?} differs from lease_discovery.local_address's IP {ip:?}; with source \"kubernetes_endpoints\" the peers name this server by its IP, so leave local_name out or set it to {ip:?}",
                        c.local_name
                    ))
                }
            }
        }
        // Lease mode names every peer by its lease's hostname label, so the other nodes name this
        // server by local_hostname: the local name must be the same, or the nodes disagree on names
        // (merged discovery's precedence is name order; metrics and the status view label by name).
        if let Some(h) = c.lease_discovery.as_ref().and_then(|l| l.local_hostname.as_ref()) {
            match obj.get("local_name") {
                None => c.local_name = h.clone(),
                Some(_) if c.local_name == *h => {}
                Some(_) => {
                    return Err(format!(
                        "local_name: {:?} differs from lease_discovery.local_hostname {h:?}; in lease mode the peers name this server by its hostname, so leave local_name out or set it to {h:?}",
                        c.local_name
                    ))
                }
            }
        }
        c.client_identity = client_identity(obj)?;
        if let Some(id) = &c.client_identity {
            let route = c.route_header.as_str();
            let address = c.lease_discovery.as_ref().map(|l| l.address_header.as_str());
            for h in [Some(route), address].into_iter().flatten() {
                if id.is_identity_header(h) {
                    return Err(format!("client_identity: {h:?} is also a routing header"));
                }
            }
        }
        Ok(c)
    }

    /// Every cluster the filter may route to, local first.
    pub fn clusters(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.local_cluster.as_str())
            .chain(self.peers.iter().map(|p| p.cluster.as_str()))
            .chain(self.lease_discovery.iter().map(|l| l.cluster.as_str()))
    }
}

impl LeaseDiscovery {
    /// The local server's name when members come from the EndpointSlice: local_address's IP as
    /// text (canonical), the name every peer gives it; `None` in identity-lease mode.
    pub fn endpoints_local_name(&self) -> Option<String> {
        if self.source != MembershipSource::KubernetesEndpoints {
            return None;
        }
        let addr: std::net::SocketAddr = self.local_address.as_deref()?.parse().ok()?;
        Some(addr.ip().to_string())
    }
}

fn peers(obj: &Map<String, Value>, c: &Config) -> Result<Vec<Peer>, String> {
    let Some(v) = obj.get("peers") else {
        return Ok(Vec::new());
    };
    let list = v
        .as_array()
        .ok_or_else(|| format!("peers: expected an array, got {}", kind(v)))?;
    if list.len() >= MAX_SERVERS {
        return Err(format!("peers: at most {} peers are supported", MAX_SERVERS - 1));
    }
    let mut names: HashSet<String> = HashSet::from([c.local_name.clone()]);
    let mut clusters: HashSet<String> = HashSet::from([c.local_cluster.clone()]);
    let mut out = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let field = format!("peers[{i}]");
        let o = p
            .as_object()
            .ok_or_else(|| format!("{field}: expected an object, got {}", kind(p)))?;
        for k in o.keys() {
            if k != "name" && k != "cluster" {
                return Err(format!("{field}.{k}: unknown field (known: name, cluster)"));
            }
        }
        let name = string(o, "name")
            .map_err(|e| format!("{field}.{e}"))?
            .ok_or_else(|| format!("{field}.name: missing"))?;
        non_empty(&format!("{field}.name"), &name)?;
        let cluster = string(o, "cluster")
            .map_err(|e| format!("{field}.{e}"))?
            .ok_or_else(|| format!("{field}.cluster: missing"))?;
        non_empty(&format!("{field}.cluster"), &cluster)?;
        if !names.insert(name.clone()) {
            return Err(format!("{field}.name: duplicate name {name:?}"));
        }
        if !clusters.insert(cluster.clone()) {
            return Err(format!("{field}.cluster: duplicate cluster {cluster:?}"));
        }
        out.push(Peer { name, cluster });
    }
    Ok(out)
}

fn lease_discovery(obj: &Map<String, Value>, c: &Config) -> Result<Option<LeaseDiscovery>, String> {
    let Some(v) = obj.get("lease_discovery") else {
        return Ok(None);
    };
    let o = v
        .as_object()
        .ok_or_else(|| format!("lease_discovery: expected an object, got {}", kind(v)))?;
    if !c.peers.is_empty() {
        return Err("lease_discovery: cannot be combined with peers (choose configured peers or leases)".into());
    }
    for k in o.keys() {
        if !LEASE_FIELDS.contains(&k.as_str()) {
            return Err(format!(
                "lease_discovery.{k}: unknown field (known: {})",
                LEASE_FIELDS.join(", ")
            ));
        }
    }
    let field = |e: String| format!("lease_discovery.{e}");
    let source = match string(o, "source").map_err(field)? {
        None => MembershipSource::default(),
        Some(s) => MembershipSource::parse(&s).ok_or_else(|| {
            format!("lease_discovery.source: {s:?} is not one of \"identity_leases\", \"kubernetes_endpoints\"")
        })?,
    };
    let endpoints = source == MembershipSource::KubernetesEndpoints;
    if endpoints {
        // The slice lists IPs only: no hostname to match, and no name a hosts entry could give.
        for k in ["local_hostname", "hosts"] {
            if o.contains_key(k) {
                return Err(format!(
                    "lease_discovery.{k}: not used with source \"kubernetes_endpoints\" (the EndpointSlice lists only IPs; the local server is recognised by local_address and peers are reached at their listed IP), remove it"
                ));
            }
        }
        if !o.contains_key("local_address") {
            return Err(
                "lease_discovery.local_address: missing (with source \"kubernetes_endpoints\" the local server is recognised in the EndpointSlice by this address's IP: the apiserver's --advertise-address)"
                    .into(),
            );
        }
    }
    let cluster = string(o, "cluster")
        .map_err(field)?
        .ok_or("lease_discovery.cluster: missing")?;
    non_empty("lease_discovery.cluster", &cluster)?;
    if cluster == c.local_cluster {
        return Err("lease_discovery.cluster: must differ from local_cluster".into());
    }
    let address_header = match string(o, "address_header").map_err(field)? {
        None => "x-envoy-original-dst-host".to_string(),
        Some(h) if !h.is_empty() && !h.starts_with(':') && h.bytes().all(is_header_char) => h,
        Some(h) => {
            return Err(format!(
                "lease_discovery.address_header: {h:?} is not a valid lower-case header name"
            ))
        }
    };
    if address_header == c.route_header {
        return Err("lease_discovery.address_header: must differ from route_header".into());
    }
    let local_hostname = string(o, "local_hostname").map_err(field)?;
    if let Some(h) = &local_hostname {
        non_empty("lease_discovery.local_hostname", h)?;
    }
    let local_address = match string(o, "local_address").map_err(field)? {
        None => None,
        Some(a) => Some(
            crate::discovery::leases::parse_address(&a)
                .ok_or_else(|| format!("lease_discovery.local_address: {a:?} is not an ip:port address"))?,
        ),
    };
    if local_hostname.is_none() && local_address.is_none() {
        return Err(
            "lease_discovery.local_hostname: missing (set local_hostname or local_address so the local server's own lease is recognised)"
                .into(),
        );
    }
    let mut hosts = Vec::new();
    if let Some(h) = o.get("hosts") {
        let map = h
            .as_object()
            .ok_or_else(|| format!("lease_discovery.hosts: expected an object, got {}", kind(h)))?;
        for (name, addr) in map {
            let f = format!("lease_discovery.hosts.{name}");
            let a = addr
                .as_str()
                .ok_or_else(|| format!("{f}: expected a string, got {}", kind(addr)))?;
            let a = crate::discovery::leases::parse_address(a)
                .ok_or_else(|| format!("{f}: {a:?} is not an ip:port address"))?;
            hosts.push((name.clone(), a));
        }
    }
    let peer_port = match o.get("peer_port") {
        None => None,
        Some(Value::Number(n)) => match n.as_u64().and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0) {
            Some(p) => Some(p),
            None => {
                return Err(format!(
                    "lease_discovery.peer_port: must be a port number 1-65535, got {n}"
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "lease_discovery.peer_port: expected a port number, got {}",
                kind(other)
            ))
        }
    };
    Ok(Some(LeaseDiscovery {
        source,
        cluster,
        address_header,
        local_hostname,
        local_address,
        hosts,
        peer_port,
    }))
}

fn client_identity(obj: &Map<String, Value>) -> Result<Option<crate::request::identity::RequestHeaderNames>, String> {
    let Some(v) = obj.get("client_identity") else {
        return Ok(None);
    };
    let o = v
        .as_object()
        .ok_or_else(|| format!("client_identity: expected an object, got {}", kind(v)))?;
    for k in o.keys() {
        if !IDENTITY_FIELDS.contains(&k.as_str()) {
            return Err(format!(
                "client_identity.{k}: unknown field (known: {})",
                IDENTITY_FIELDS.join(", ")
            ));
        }
    }
    let names = |field: &str, required: bool| -> Result<Vec<String>, String> {
        let f = format!("client_identity.{field}");
        let list = match o.get(field) {
            None if required => return Err(format!("{f}: missing")),
            None => return Ok(Vec::new()),
            Some(Value::Array(a)) => a,
            Some(other) => return Err(format!("{f}: expected an array of header names, got {}", kind(other))),
        };
        let mut out = Vec::new();
        for (i, n) in list.iter().enumerate() {
            let n = n
                .as_str()
                .ok_or_else(|| format!("{f}[{i}]: expected a string, got {}", kind(n)))?
                .to_ascii_lowercase();
            if n.is_empty() || n.starts_with(':') || !n.bytes().all(is_header_char) {
                return Err(format!("{f}[{i}]: {n:?} is not a valid header name"));
            }
            out.push(n);
        }
        if required && out.is_empty() {
            return Err(format!("{f}: must name at least one header"));
        }
        Ok(out)
    };
    Ok(Some(crate::request::identity::RequestHeaderNames {
        username: names("username_headers", true)?,
        uid: names("uid_headers", false)?,
        group: names("group_headers", true)?,
        extra_prefix: names("extra_headers_prefixes", false)?,
    }))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn string(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match obj.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{field}: expected a string, got {}", kind(other))),
    }
}

fn non_empty(field: &str, s: &str) -> Result<(), String> {
    if s.trim().is_empty() {
        return Err(format!("{field}: must not be empty"));
    }
    Ok(())
}

fn positive_int(obj: &Map<String, Value>, field: &str) -> Result<Option<u64>, String> {
    match obj.get(field) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v > 0 => Ok(Some(v)),
            _ => Err(format!("{field}: must be a positive integer, got {n}")),
        },
        Some(other) => Err(format!("{field}: expected a positive integer, got {}", kind(other))),
    }
}

fn duration(obj: &Map<String, Value>, field: &str) -> Result<Option<Duration>, String> {
    let Some(s) = string(obj, field)? else { return Ok(None) };
    let d = parse_duration(&s)
        .ok_or_else(|| format!("{field}: {s:?} is not a duration like \"500ms\", \"2s\" or \"1m\""))?;
    if d.is_zero() {
        return Err(format!("{field}: must be positive"));
    }
    Ok(Some(d))
}

/// `<digits><unit>` with unit `ms`, `s` or `m`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

fn is_header_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
}

/// Root id of the peer listener's gate (`src/wasm/peer_gate.rs`): another role of the same module.
pub const PEER_GATE_ROOT_ID: &str = "kube-peer-proxy-peer-gate";

/// The fields of the peer gate's configuration.
pub const PEER_GATE_FIELDS: &[&str] = &["allowed_names"];

/// The peer listener's gate: which verified front-proxy-CA certificates may assert identities, as
/// kube-apiserver's `--requestheader-allowed-names` (subject CN only; empty = any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerGateConfig {
    pub allowed_names: Vec<String>,
}

impl PeerGateConfig {
    pub fn parse(bytes: &[u8]) -> Result<PeerGateConfig, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("configuration: invalid JSON: {e}"))?;
        let obj = v.as_object().ok_or("configuration: expected a JSON object")?;
        for k in obj.keys() {
            if !PEER_GATE_FIELDS.contains(&k.as_str()) {
                return Err(format!("{k}: unknown field (known: {})", PEER_GATE_FIELDS.join(", ")));
            }
        }
        let list = obj
            .get("allowed_names")
            .ok_or("allowed_names: missing (an empty list allows any name)")?;
        let items = list
            .as_array()
            .ok_or_else(|| format!("allowed_names: expected a list, got {}", kind(list)))?;
        let mut allowed_names = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let name = item
                .as_str()
                .ok_or_else(|| format!("allowed_names[{i}]: expected a string, got {}", kind(item)))?;
            non_empty(&format!("allowed_names[{i}]"), name)?;
            allowed_names.push(name.to_string());
        }
        Ok(PeerGateConfig { allowed_names })
    }
}
