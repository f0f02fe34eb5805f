//! Peer membership from the EndpointSlice `default/kubernetes`, which every kube-apiserver's lease
//! endpoint reconciler keeps (`--endpoint-reconciler-type=lease`, the default on every version):
//! the live advertise addresses, with no per-node list and no version requirement.
//!
//! Upstream (Kubernetes v1.36), read for this module:
//! * `pkg/controlplane/reconcilers/lease.go`: each apiserver refreshes a master lease under
//!   `/masterleases/<ip>` in etcd (TTL `DefaultEndpointReconcilerTTL` = 15 s, `pkg/controlplane/instance.go`)
//!   every reconcile (`DefaultEndpointReconcilerInterval` = 10 s) and writes the IPs of the live leases
//!   into the `kubernetes` Service's Endpoints and EndpointSlice; `RemoveEndpoints` (graceful shutdown)
//!   deletes its own lease first. A crashed server's IP stays until its lease expires.
//! * `pkg/controlplane/reconcilers/endpointsadapter.go`: the primary slice is named like the service
//!   (`kubernetes`), label `kubernetes.io/service-name: kubernetes`, `addressType` the primary service
//!   IP's family (dual-stack adds `kubernetes-v6`/`-v4`, not read here), one endpoint per IP
//!   `{"addresses": [ip], "conditions": {"ready": true}}`.
//! * `pkg/controlplane/controller/kubernetesservice/controller.go` (`createEndpointPortSpec`): one
//!   port, `{"name": "https", "protocol": "TCP", "port": <--secure-port>}`, shared by all apiservers.
//! * `staging/src/k8s.io/api/discovery/v1/types.go`: a nil `ready` is an unknown state that
//!   consumers should interpret as ready; Go writes nil slices (`endpoints`, `ports`) as `null`.
//!
//! The slice is read by name, never listed by label: anyone allowed to create EndpointSlices in
//! `default` could add one carrying that label, while the object `kubernetes` is the apiservers'.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::leases::{nullable, parse_address, LeasePeer, Members};

/// The one EndpointSlice the apiservers write, read through the local apiserver.
pub const ENDPOINT_SLICE_PATH: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes";
/// The slice's (and the Service's) name and namespace.
pub const SLICE_NAME: &str = "kubernetes";
pub const SLICE_NAMESPACE: &str = "default";
/// The port name the apiservers give their secure port.
pub const PORT_NAME: &str = "https";

#[derive(Deserialize)]
struct SliceDoc {
    #[serde(default, deserialize_with = "nullable")]
    kind: String,
    #[serde(default, deserialize_with = "nullable")]
    metadata: Meta,
    #[serde(rename = "addressType", default, deserialize_with = "nullable")]
    address_type: String,
    #[serde(default, deserialize_with = "nullable")]
    endpoints: Vec<Endpoint>,
    #[serde(default, deserialize_with = "nullable")]
    ports: Vec<Port>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default, deserialize_with = "nullable")]
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    namespace: String,
}

#[derive(Deserialize, Default)]
struct Endpoint {
    #[serde(default, deserialize_with = "nullable")]
    addresses: Vec<String>,
    #[serde(default, deserialize_with = "nullable")]
    conditions: Conditions,
}

#[derive(Deserialize, Default)]
struct Conditions {
    #[serde(default)]
    ready: Option<bool>,
}

#[derive(Deserialize, Default)]
struct Port {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    port: Option<i64>,
}

/// The port peers are reached at when `peer_port` is unset: the `https` port, else the only one
/// (TCP, or protocol unset); `None` if neither exists.
fn slice_port(ports: &[Port]) -> Option<u16> {
    let tcp = |p: &&Port| p.protocol.as_deref().is_none_or(|x| x == "TCP");
    let chosen = match ports.iter().find(|p| p.name.as_deref() == Some(PORT_NAME)) {
        Some(p) => p,
        None if ports.len() == 1 => ports.first()?,
        None => return None,
    };
    Some(chosen)
        .filter(tcp)
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
}

/// An address of a slice of `family` (`IPv4`/`IPv6`) as an IP, `None` if it is not one of that
/// family. Strict: no leading zeros and no zone, since the reconciler writes Go's canonical
/// `ip.String()` and anything else was written by someone else.
fn parse_ip(family: &str, s: &str) -> Option<IpAddr> {
    match family {
        "IPv4" => s.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        "IPv6" => s.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        _ => None,
    }
}

/// Parses the EndpointSlice `default/kubernetes` into its members other than `own` (the local
/// server's IP), sorted by id, one per IP, in the shape the lease path gives membership: id = the
/// canonical IP; holder and hostname empty (the slice says nothing of restarts, so a restart is a
/// leave, then a join; the member is named by its IP); address = `ip:peer_port`, or the slice's
/// port when `peer_port` is unset (an IP [`parse_address`] refuses, such as unspecified or
/// multicast, gives a member without an address, as a lease without one does); no expiry (the
/// apiservers drop expired IPs themselves). An endpoint whose `ready` is false is not a member;
/// absent or null means ready.
///
/// The whole document is rejected (the caller keeps its last good membership) if it is not a JSON
/// object of the right types, its kind is not `EndpointSlice`, it is not `default/kubernetes`, its
/// `addressType` is not `IPv4`/`IPv6`, an address is not an IP of that family, or no port is usable
/// while `peer_port` is unset: dropping parts of it would look like members leaving.
pub fn parse_endpoint_slice(
    body: &[u8],
    own: Option<IpAddr>,
    peer_port: Option<u16>,
) -> Result<Vec<LeasePeer>, String> {
    parse_endpoint_slice_members(body, own, peer_port).map(|m| m.peers)
}

/// [`parse_endpoint_slice`], also saying whether `own` is among the slice's addresses (any address
/// of any endpoint, ready or not). The apiservers write the slice from the master leases they see
/// when they reconcile (every 10 s), so a server that just started may not be in it yet.
pub fn parse_endpoint_slice_members(
    body: &[u8],
    own: Option<IpAddr>,
    peer_port: Option<u16>,
) -> Result<Members, String> {
    // A derived struct also deserializes from a JSON array; only an object is a slice.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err("EndpointSlice: the body is not a JSON object".into());
    }
    let doc: SliceDoc = serde_json::from_slice(body).map_err(|e| format!("EndpointSlice: invalid JSON: {e}"))?;
    if !doc.kind.is_empty() && doc.kind != "EndpointSlice" {
        return Err(format!("EndpointSlice: kind {:?}, expected EndpointSlice", doc.kind));
    }
    if doc.metadata.name != SLICE_NAME {
        return Err(format!(
            "EndpointSlice: metadata.name {:?}, expected {SLICE_NAME:?}",
            doc.metadata.name
        ));
    }
    if !doc.metadata.namespace.is_empty() && doc.metadata.namespace != SLICE_NAMESPACE {
        return Err(format!(
            "EndpointSlice: metadata.namespace {:?}, expected {SLICE_NAMESPACE:?}",
            doc.metadata.namespace
        ));
    }
    let family = doc.address_type.as_str();
    if family != "IPv4" && family != "IPv6" {
        return Err(format!("EndpointSlice: addressType {family:?}, expected IPv4 or IPv6"));
    }
    let port = match peer_port {
        Some(p) => p,
        None => slice_port(&doc.ports)
            .ok_or("EndpointSlice: no usable port (no TCP port named https, nor a single port)")?,
    };
    let mut peers: BTreeMap<String, LeasePeer> = BTreeMap::new();
    let mut own_listed = false;
    for (i, endpoint) in doc.endpoints.into_iter().enumerate() {
        let mut ips = Vec::with_capacity(endpoint.addresses.len());
        for a in &endpoint.addresses {
            let ip = parse_ip(family, a)
                .ok_or_else(|| format!("EndpointSlice: endpoints[{i}]: {a:?} is not an {family} address"))?;
            ips.push(ip);
        }
        // Upstream writes one address per endpoint; the others of an endpoint are the same
        // backend (the API says so, and kube-proxy uses the first).
        own_listed |= own.is_some_and(|o| ips.contains(&o));
        let Some(ip) = ips.first().copied() else { continue };
        if endpoint.conditions.ready == Some(false) || Some(ip) == own {
            continue;
        }
        let id = ip.to_string();
        let address = parse_address(&SocketAddr::new(ip, port).to_string());
        peers.entry(id.clone()).or_insert(LeasePeer {
            id,
            holder: String::new(),
            hostname: String::new(),
            address,
            expires_ms: None,
        });
    }
    Ok(Members {
        peers: peers.into_values().collect(),
        own_listed,
    })
}
