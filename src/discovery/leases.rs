//! Peer membership from kube-apiserver identity Leases, mirroring upstream's peer discovery.
//!
//! Upstream (Kubernetes v1.36), read for this module:
//! * `staging/src/k8s.io/apiserver/pkg/util/peerproxy/peer_discovery.go`: `syncPeerDiscoveryCache`
//!   lists the leases matching the identity selector and keeps those `isValidPeerIdentityLease`
//!   accepts: label `apiserver.kubernetes.io/identity=kube-apiserver`, not the server's own lease
//!   (`lease.Name == serverID`), `spec.holderIdentity` set. Upstream never looks at expiry there.
//! * `staging/src/k8s.io/apiserver/pkg/util/peerproxy/peerproxy.go`: an update whose
//!   `holderIdentity` changed (same name) is a restarted server and re-triggers its discovery.
//! * `pkg/controlplane/apiserver/server.go`: the lease shape. Name = the APIServerID
//!   (`apiserver-<base32(sha256(hostname, "kube-apiserver"))>`, `staging/src/k8s.io/apiserver/pkg/server/config.go`),
//!   namespace `kube-system`, `holderIdentity = <APIServerID>_<uuid>` (new uuid per process),
//!   `leaseDurationSeconds = 3600`, renewed every 10 s; labels `apiserver.kubernetes.io/identity`
//!   and `kubernetes.io/hostname`; annotation `kubernetes.io/peer-advertise-address` when the
//!   `UnknownVersionInteroperabilityProxy` gate is on (Beta, default on, since 1.36).
//! * `pkg/controlplane/apiserver/peer.go`: the selector `IdentityLeaseComponentLabelKey + "=" +
//!   KubeAPIServer`, and `getPeerAddress` = `net.JoinHostPort(ip, port)` (IPv6 bracketed). Upstream
//!   itself reads peer addresses from its etcd endpoint leases (`/peerserverleases/`), which a
//!   filter cannot see; the annotation carries the same value.
//! * `pkg/controlplane/controller/apiserverleasegc/gc_controller.go`: `isLeaseExpired` =
//!   `renewTime + leaseDurationSeconds` is before now; [`LeasePeer::is_live`] uses the same edge.
//! * `staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go`: `renewTime` is
//!   `2006-01-02T15:04:05.000000Z07:00`, and JSON `null` is the zero time.

use serde::{Deserialize, Deserializer};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The identity leases of all kube-apiservers, listed through the local apiserver.
pub const LEASE_LIST_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver";
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
/// The value [`IDENTITY_LABEL`] has on kube-apiserver leases (other apiservers may use other values).
pub const IDENTITY_VALUE: &str = "kube-apiserver";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const ADDRESS_ANNOTATION: &str = "kubernetes.io/peer-advertise-address";

/// One peer apiserver as its identity lease describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasePeer {
    /// The lease name: the server's APIServerID, stable across restarts.
    pub id: String,
    /// `spec.holderIdentity`: changes on every process start.
    pub holder: String,
    /// The `kubernetes.io/hostname` label (empty if absent).
    pub hostname: String,
    /// Canonical `ip:port` from the annotation, else from the configured hosts map; `None` if
    /// neither gives a valid address (a member whose API set can never be learned).
    pub address: Option<String>,
    /// `renewTime + leaseDurationSeconds` in ms since the epoch; `None` if either is missing.
    pub expires_ms: Option<u64>,
}

impl LeasePeer {
    /// Live at `now_ms`? Without expiry information a lease counts as live (upstream never checks
    /// expiry); otherwise it is live up to and including its expiry instant, like upstream's GC
    /// (`expiry.Before(now)` means expired).
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.expires_ms.is_none_or(|e| now_ms <= e)
    }
}

/// What identifies the local apiserver's own lease (excluded from peers). The filter does not know
/// its apiserver's APIServerID, so it matches the hostname label or the resolved address instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Own {
    pub hostname: Option<String>,
    pub address: Option<String>,
}

/// Diff of two live peer sets by id; every list is sorted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Same id, different holder: the server restarted, so its discovery must be fetched again.
    pub restarted: Vec<String>,
}

/// `null` and a missing field both mean the default, as Go's decoder treats them.
pub(crate) fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

#[derive(Deserialize)]
struct LeaseListDoc {
    #[serde(default, deserialize_with = "nullable")]
    kind: String,
    /// `None` if missing or `null` (Go encodes an empty list's nil slice as `null`).
    #[serde(default)]
    items: Option<Vec<Lease>>,
}

#[derive(Deserialize, Default)]
struct Lease {
    #[serde(default, deserialize_with = "nullable")]
    metadata: Meta,
    #[serde(default, deserialize_with = "nullable")]
    spec: Spec,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default, deserialize_with = "nullable")]
    name: String,
    #[serde(default, deserialize_with = "nullable")]
    labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "nullable")]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct Spec {
    #[serde(rename = "holderIdentity", default)]
    holder_identity: Option<String>,
    #[serde(rename = "leaseDurationSeconds", default)]
    lease_duration_seconds: Option<i64>,
    #[serde(rename = "renewTime", default)]
    renew_time: Option<String>,
}

/// [`parse_lease_list_at`] with the annotation's port used as written.
pub fn parse_lease_list(body: &[u8], own: &Own, hosts: &[(String, String)]) -> Result<Vec<LeasePeer>, String> {
    parse_lease_list_at(body, own, hosts, None)
}

/// Where a peer is reached, from its lease's `kubernetes.io/peer-advertise-address`: the host as
/// advertised, with `peer_port` instead of the advertised port when one is set.
///
/// kube-apiserver writes the annotation from `--advertise-address` and `--secure-port`, whatever
/// `--peer-advertise-ip/port` say (v1.36.3 `pkg/controlplane/apiserver/server.go` passes
/// `c.Extra.PeerAdvertiseAddress`, which `config.go` never sets). In kubeadm's layout that port is
/// Envoy's client listener, which verifies the caller against the cluster CA; the peer listener
/// (the front-proxy CA) is on the same host at `peer_port`.
pub fn peer_address(advertised: &str, peer_port: Option<u16>) -> Option<String> {
    let canonical = parse_address(advertised)?;
    let Some(port) = peer_port else {
        return Some(canonical);
    };
    let mut addr: SocketAddr = canonical.parse().ok()?;
    addr.set_port(port);
    parse_address(&addr.to_string())
}

/// Parses a `LeaseList` body into the peers: valid identity leases (label value `kube-apiserver`,
/// non-empty `holderIdentity`, like upstream's `isValidPeerIdentityLease`, which also drops a
/// missing one) that are not our own, sorted by id, one per id. The address comes from the
/// annotation ([`peer_address`]: its port replaced by `peer_port` when set), else from `hosts`
/// (hostname → `ip:port`, used as written). `own.address` matches a lease's address as advertised
/// or as resolved.
///
/// A body that is not a list with `items`, or whose fields have the wrong JSON types, is rejected
/// as a whole: no apiserver sends one, and dropping just one item would look like that member left.
/// The caller keeps its last good list.
pub fn parse_lease_list_at(
    body: &[u8],
    own: &Own,
    hosts: &[(String, String)],
    peer_port: Option<u16>,
) -> Result<Vec<LeasePeer>, String> {
    parse_lease_members(body, own, hosts, peer_port).map(|m| m.peers)
}

/// A membership document read: the peers, and whether it listed the local server itself.
///
/// A document that does not list the local server was written from a view that misses at least
/// that one (an EndpointSlice reconciled before this server's master lease was seen), or in a
/// layout the parser does not know (another identity label value, namespace or annotation): the
/// list is not known to be complete, so the caller does not use it (see
/// `Syncer::interpret_members`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    pub peers: Vec<LeasePeer>,
    /// The local server's own entry was in the document (a valid identity lease matched by
    /// [`Own`], or `local_address`'s IP among the slice's addresses, ready or not).
    pub own_listed: bool,
}

/// [`parse_lease_list_at`], also saying whether a valid identity lease (the label value
/// `kube-apiserver`, a non-empty holder) of the local server (matched by [`Own`]) was listed.
pub fn parse_lease_members(
    body: &[u8],
    own: &Own,
    hosts: &[(String, String)],
    peer_port: Option<u16>,
) -> Result<Members, String> {
    // A derived struct also deserializes from a JSON array; only an object is a list.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err("lease list: the body is not a JSON object".into());
    }
    let doc: LeaseListDoc = serde_json::from_slice(body).map_err(|e| format!("lease list: invalid JSON: {e}"))?;
    if !doc.kind.is_empty() && doc.kind != "LeaseList" && doc.kind != "List" {
        return Err(format!("lease list: kind {:?}, expected LeaseList", doc.kind));
    }
    let items = match doc.items {
        Some(items) => items,
        None if doc.kind == "LeaseList" => Vec::new(),
        None => return Err("lease list: no items".into()),
    };
    let own_address = own.address.as_deref().and_then(parse_address);
    let own_hostname = own.hostname.as_deref().filter(|h| !h.is_empty());

    let mut peers: BTreeMap<String, LeasePeer> = BTreeMap::new();
    let mut own_listed = false;
    for lease in items {
        let Lease { metadata, spec } = lease;
        if metadata.name.is_empty() || metadata.labels.get(IDENTITY_LABEL).map(String::as_str) != Some(IDENTITY_VALUE) {
            continue;
        }
        let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
            continue;
        };
        let hostname = metadata.labels.get(HOSTNAME_LABEL).cloned().unwrap_or_default();
        let advertised = metadata.annotations.get(ADDRESS_ANNOTATION).map(String::as_str);
        let address = advertised.and_then(|a| peer_address(a, peer_port)).or_else(|| {
            hosts
                .iter()
                .find(|(h, _)| !hostname.is_empty() && *h == hostname)
                .and_then(|(_, a)| parse_address(a))
        });
        let is_own = own_hostname.is_some_and(|h| h == hostname)
            || own_address
                .as_ref()
                .is_some_and(|a| address.as_ref() == Some(a) || advertised.and_then(parse_address).as_ref() == Some(a));
        if is_own {
            own_listed = true;
            continue;
        }
        let expires_ms = expiry_ms(spec.renew_time.as_deref(), spec.lease_duration_seconds);
        peers.entry(metadata.name.clone()).or_insert(LeasePeer {
            id: metadata.name,
            holder,
            hostname,
            address,
            expires_ms,
        });
    }
    Ok(Members {
        peers: peers.into_values().collect(),
        own_listed,
    })
}

/// `renewTime + leaseDurationSeconds` like Go's `Time.Add`: an unparseable renewTime counts as
/// missing; a non-positive duration (which validation forbids) expires at or before renewTime.
fn expiry_ms(renew_time: Option<&str>, duration_s: Option<i64>) -> Option<u64> {
    let renew = parse_rfc3339_ms(renew_time?)?;
    Some(renew.saturating_add_signed(duration_s?.saturating_mul(1000)))
}

/// RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±hh:mm)`) → ms since the epoch, the fraction
/// truncated to ms; `None` if invalid or before 1970. Second 60 is rejected, as Go's parser does.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    if b.get(4) != Some(&b'-')
        || b.get(7) != Some(&b'-')
        || !matches!(b.get(10), Some(b'T' | b't'))
        || b.get(13) != Some(&b':')
        || b.get(16) != Some(&b':')
    {
        return None;
    }
    let mut i = 19;
    let mut frac_ms: i64 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while let Some(d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            if i - start < 3 {
                frac_ms = frac_ms * 10 + i64::from(d - b'0');
            }
            i += 1;
        }
        let n = i - start;
        if n == 0 {
            return None;
        }
        for _ in n..3 {
            frac_ms *= 10;
        }
    }
    let offset_min: i64 = match b.get(i)? {
        b'Z' | b'z' => {
            i += 1;
            0
        }
        sign @ (b'+' | b'-') => {
            let oh = digits(b, i + 1, 2)?;
            let om = digits(b, i + 4, 2)?;
            if b.get(i + 3) != Some(&b':') || oh > 23 || om > 59 {
                return None;
            }
            i += 6;
            let m = oh * 60 + om;
            if *sign == b'-' {
                -m
            } else {
                m
            }
        }
        _ => return None,
    };
    if i != b.len()
        || !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_min * 60;
    u64::try_from(secs * 1_000 + frac_ms).ok()
}

/// `n` ASCII digits at `at`, as a number.
fn digits(b: &[u8], at: usize, n: usize) -> Option<i64> {
    let mut v: i64 = 0;
    for k in at..at + n {
        let d = *b.get(k)?;
        if !d.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(d - b'0');
    }
    Some(v)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `ip:port` with an IPv4 dotted quad or a bracketed IPv6 literal and port 1..=65535, returned in
/// canonical form. Hostnames are rejected: Envoy's `ORIGINAL_DST` cluster needs an IP literal, and
/// an address the filter picks must never be a name a DNS answer could redirect. Unspecified,
/// multicast and broadcast addresses are rejected too: none is a peer (`0.0.0.0` would reach this
/// host).
pub fn parse_address(s: &str) -> Option<String> {
    let (ip, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, port) = rest.split_once("]:")?;
        (IpAddr::V6(host.parse::<Ipv6Addr>().ok()?), port)
    } else {
        let (host, port) = s.split_once(':')?;
        (IpAddr::V4(host.parse::<Ipv4Addr>().ok()?), port)
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let unusable = ip.is_unspecified()
        || ip.is_multicast()
        || match ip {
            IpAddr::V4(v4) => v4.is_broadcast(),
            IpAddr::V6(_) => false,
        };
    if unusable {
        return None;
    }
    Some(SocketAddr::new(ip, port).to_string())
}

/// Diff between the previous and the new live peer sets (by id): added, removed, and restarted
/// (same id, different holder: upstream re-fetches that server's discovery on such an update).
pub fn diff(old: &[LeasePeer], new: &[LeasePeer]) -> Changes {
    let old_by_id: BTreeMap<&str, &str> = old.iter().rev().map(|p| (p.id.as_str(), p.holder.as_str())).collect();
    let new_by_id: BTreeMap<&str, &str> = new.iter().rev().map(|p| (p.id.as_str(), p.holder.as_str())).collect();
    let mut changes = Changes::default();
    for (id, holder) in &new_by_id {
        match old_by_id.get(id) {
            None => changes.added.push((*id).to_string()),
            Some(old_holder) if old_holder != holder => changes.restarted.push((*id).to_string()),
            Some(_) => {}
        }
    }
    let new_ids: BTreeSet<&str> = new_by_id.keys().copied().collect();
    changes.removed = old_by_id
        .keys()
        .filter(|id| !new_ids.contains(*id))
        .map(|id| (*id).to_string())
        .collect();
    changes
}
