//! Lease membership: in lease mode the members are the servers whose identity lease is live
//! (upstream `peer_discovery.go`; the lease list itself is parsed by [`crate::discovery::leases`]),
//! or, with `source: kubernetes_endpoints`, the IPs of the EndpointSlice `default/kubernetes`
//! ([`crate::discovery::endpoints`], parsed into the same peers). A new lease is a member fetched at
//! once; a changed holder is a restart (its API set is unknown again); a lease that is gone or
//! expired leaves when the round ends. The slice has no holder: a restart there is a leave, then a join.
//!
//! A membership document counts only if it lists this server itself: one that does not was written
//! from a view that misses at least this server (a slice reconciled before its master lease was
//! seen, up to 10 s after a start), or in a layout this filter does not know (a future version's
//! identity label, namespace or annotation). Either way it may miss others, and trusting it would
//! allow a false 404; it is a decode error, and the last good membership is kept (or it stays unknown).

use super::{Outcome, Part, Server, Step, SyncErrorKind, Syncer};
use crate::config::MembershipSource;
use crate::discovery::endpoints;
use crate::discovery::leases::{self, LeasePeer};
use crate::snapshot::{self, ServerRef};

impl Syncer {
    /// The membership document's answer as peers; an error keeps the last good membership.
    pub(super) fn interpret_members(&self, outcome: Outcome) -> Result<Vec<LeasePeer>, (SyncErrorKind, String)> {
        let Some(config) = &self.leases else {
            return Err((SyncErrorKind::Decode, "lease mode is off".into()));
        };
        let slice = config.source == MembershipSource::KubernetesEndpoints;
        let body = match outcome {
            Outcome::Response { status: 200, body, .. } => body,
            // What to check, said where an operator reads it: the object is the reconciler's.
            Outcome::Response { status: 404, .. } if slice => {
                return Err((
                    SyncErrorKind::HttpStatus,
                    "HTTP 404: no EndpointSlice default/kubernetes; is the apiservers' --endpoint-reconciler-type none? (the last membership is kept)".into(),
                ))
            }
            Outcome::Response { status: status @ (401 | 403), .. } if slice => {
                return Err((
                    SyncErrorKind::HttpStatus,
                    format!("HTTP {status}: the discovery credential may not get EndpointSlice default/kubernetes (RBAC: get endpointslices.discovery.k8s.io in default)"),
                ))
            }
            Outcome::Response { status, .. } => return Err((SyncErrorKind::HttpStatus, format!("HTTP {status}"))),
            failed => return Err(self.no_answer(failed)),
        };
        if slice {
            let own = config
                .local_address
                .as_deref()
                .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
                .map(|a| a.ip());
            let members = endpoints::parse_endpoint_slice_members(&body.to_vec(), own, config.peer_port)
                .map_err(|e| (SyncErrorKind::Decode, e))?;
            if !members.own_listed {
                let ip = own.map_or_else(|| "no local_address".to_string(), |ip| ip.to_string());
                return Err((
                    SyncErrorKind::Decode,
                    format!("EndpointSlice default/kubernetes does not list this server ({ip}): it is not yet written from a view that includes it, or lease_discovery.local_address is not its --advertise-address; the last membership is kept"),
                ));
            }
            return Ok(members.peers);
        }
        let own = leases::Own {
            hostname: config.local_hostname.clone(),
            address: config.local_address.clone(),
        };
        let members = leases::parse_lease_members(&body.to_vec(), &own, &config.hosts, config.peer_port)
            .map_err(|e| (SyncErrorKind::Decode, e))?;
        if !members.own_listed {
            let (who, check) = match (own.hostname.as_deref(), own.address.as_deref()) {
                (Some(h), Some(a)) => (
                    format!("hostname {h} or address {a}"),
                    "local_hostname is not its hostname (label kubernetes.io/hostname) nor local_address its advertised address",
                ),
                (Some(h), None) => (format!("hostname {h}"), "local_hostname is not its hostname (label kubernetes.io/hostname)"),
                (None, a) => (
                    format!("address {}", a.unwrap_or("unset")),
                    "local_address is not its advertised address (annotation kubernetes.io/peer-advertise-address, or the hosts map)",
                ),
            };
            return Err((
                SyncErrorKind::Decode,
                format!("the identity lease list has no identity lease of this server ({who}): an unknown lease layout (label {}={}, namespace kube-system, holderIdentity set), or {check}; the last membership is kept", leases::IDENTITY_LABEL, leases::IDENTITY_VALUE),
            ));
        }
        Ok(members.peers)
    }

    /// Applies a lease list: new live leases become members (fetched at once), a changed holder
    /// means the server restarted (its API set is unknown again and fetched at once), and members
    /// whose lease is gone or expired leave when the round ends.
    pub(super) fn apply_leases(&mut self, peers: Vec<LeasePeer>, now_ms: u64, step: &mut Step) {
        let Some(config) = self.leases.clone() else { return };
        self.dirty |= !self.leases_listed;
        self.leases_listed = true;
        let live: Vec<LeasePeer> = peers.into_iter().filter(|p| p.is_live(now_ms)).collect();
        for s in self.servers.iter_mut().filter(|s| s.lease.is_some()) {
            let id = s.lease.as_ref().map(|l| l.id.clone()).unwrap_or_default();
            if !live.iter().any(|p| p.id == id) && !s.leaving {
                let what = match config.source {
                    MembershipSource::IdentityLeases => format!("lease {id} gone"),
                    MembershipSource::KubernetesEndpoints => "gone from EndpointSlice default/kubernetes".into(),
                };
                log::info!("kube-peer-proxy: apiserver {} left ({what})", s.reference.name);
                s.leaving = true;
            }
        }
        for p in live {
            let existing = self
                .servers
                .iter()
                .position(|s| !s.leaving && s.lease.as_ref().is_some_and(|l| l.id == p.id));
            match existing {
                Some(i) => {
                    let Some(s) = self.servers.get_mut(i) else { continue };
                    let restarted = s.lease.as_ref().is_some_and(|l| l.holder != p.holder);
                    let moved = s.reference.address != p.address;
                    s.lease = Some(p.clone());
                    if restarted || moved {
                        log::info!(
                            "kube-peer-proxy: apiserver {} restarted; its API set is refetched",
                            s.reference.name
                        );
                        s.reference.address = p.address.clone();
                        s.core = Part::default();
                        s.groups = Part::default();
                        s.cache.clear();
                        s.reachable = true;
                        self.dirty = true;
                        if s.work.pending == 0 {
                            self.start_server(i, step);
                        } else {
                            s.refetch = true;
                        }
                    }
                }
                None => {
                    if self.servers.len() >= snapshot::MAX_SERVERS {
                        log::warn!(
                            "kube-peer-proxy: more than {} apiservers; member {} ignored",
                            snapshot::MAX_SERVERS,
                            p.id
                        );
                        continue;
                    }
                    let name = if p.hostname.is_empty() {
                        p.id.clone()
                    } else {
                        p.hostname.clone()
                    };
                    let what = match config.source {
                        MembershipSource::IdentityLeases => format!("lease {}", p.id),
                        MembershipSource::KubernetesEndpoints => "in EndpointSlice default/kubernetes".into(),
                    };
                    log::info!(
                        "kube-peer-proxy: apiserver {name} joined ({what}, address {})",
                        p.address.as_deref().unwrap_or("unknown")
                    );
                    let reference = ServerRef {
                        name,
                        cluster: config.cluster.clone(),
                        local: false,
                        address: p.address.clone(),
                    };
                    self.servers.push(Server::new(reference, Some(p)));
                    self.dirty = true;
                    let i = self.servers.len().saturating_sub(1);
                    self.start_server(i, step);
                }
            }
        }
    }

    /// Members whose lease expired (renewTime + leaseDurationSeconds) leave even while the lease
    /// list cannot be read.
    pub(super) fn expire_leases(&mut self, now_ms: u64) {
        let before = self.servers.len();
        self.servers
            .retain(|s| s.lease.as_ref().is_none_or(|l| l.is_live(now_ms)) && !s.leaving);
        if self.servers.len() != before {
            self.dirty = true;
        }
    }
}
