//! Scheduling: when a round starts and ends, the fetches it makes, and where each answer goes
//! (lease lists and the EndpointSlice to [`super::membership`], documents to [`super::answers`] and
//! [`super::legacy`]); a round that has every answer (or passed its deadline) ends in
//! [`super::build`].

use super::legacy;
use super::{Fetch, InFlight, Outcome, Purpose, Step, SyncError, SyncErrorKind, Syncer, Work, DISCOVERY_ACCEPT};
use crate::config::MembershipSource;
use crate::discovery::{endpoints, leases};
use crate::PEER_PROXIED_HEADER;

impl Syncer {
    /// Called on every timer tick: starts a round when one is due, and ends a round whose
    /// answers are overdue (the host normally enforces the per-fetch timeout itself).
    pub fn on_tick(&mut self, now_ms: u64) -> Step {
        let mut step = Step::default();
        self.probe_local(now_ms, &mut step);
        if let Some(deadline) = self.round_deadline_ms {
            if now_ms < deadline {
                return step;
            }
            let overdue: Vec<u64> = self.in_flight.keys().copied().collect();
            for id in overdue {
                let more = self.on_response(id, Outcome::Overdue, now_ms);
                step.errors.extend(more.errors);
                step.publish = step.publish.or(more.publish);
            }
            self.in_flight.clear();
            self.round_deadline_ms = None;
        }
        if now_ms < self.next_round_ms {
            return step;
        }
        self.next_round_ms = now_ms.saturating_add(self.refresh_ms);
        // Legacy servers need a second phase of fetches (the walk and `/openapi/v3`) and a third
        // (the group versions only the OpenAPI index lists), hence room for three timeouts and slack.
        self.round_deadline_ms =
            Some(now_ms.saturating_add(self.fetch_timeout_ms.saturating_mul(3).saturating_add(500)));
        self.expire_leases(now_ms);
        if let Some(source) = self.leases.as_ref().map(|l| l.source) {
            let local = self.servers.iter().position(|s| s.reference.local).unwrap_or(0);
            let path = match source {
                MembershipSource::IdentityLeases => leases::LEASE_LIST_PATH,
                MembershipSource::KubernetesEndpoints => endpoints::ENDPOINT_SLICE_PATH,
            };
            step.fetches.push(self.fetch(local, path.to_string(), Purpose::Members));
        }
        for i in 0..self.servers.len() {
            self.start_server(i, &mut step);
        }
        step
    }

    pub(super) fn start_server(&mut self, i: usize, step: &mut Step) {
        let Some(s) = self.servers.get_mut(i) else { return };
        if !s.fetchable() || s.leaving {
            return;
        }
        s.work = Work::default();
        step.fetches.push(self.fetch(i, "/api".to_string(), Purpose::ApiRoot));
        step.fetches.push(self.fetch(i, "/apis".to_string(), Purpose::ApisRoot));
    }

    /// A GET's headers, the discovery credential's included: one place for the fetches and the
    /// local readiness probe.
    pub(super) fn get_headers(&self, path: &str, accept: &str, proxied: bool) -> Vec<(String, String)> {
        let mut headers = vec![
            (":method".to_string(), "GET".to_string()),
            (":path".to_string(), path.to_string()),
            (":authority".to_string(), self.authority.clone()),
            ("accept".to_string(), accept.to_string()),
        ];
        if proxied {
            headers.push((PEER_PROXIED_HEADER.to_string(), "true".to_string()));
        }
        headers.extend(self.extra_headers.iter().cloned());
        headers
    }

    /// A fetch of `path` from `servers[server]`: marked as already proxied, with its cached ETag
    /// and (lease mode) the peer's address header.
    pub(super) fn fetch(&mut self, server: usize, path: String, purpose: Purpose) -> Fetch {
        let id = self.next_id;
        self.next_id += 1;
        let accept = if matches!(purpose, Purpose::Members | Purpose::OpenApiIndex) {
            "application/json"
        } else {
            DISCOVERY_ACCEPT
        };
        let mut headers = self.get_headers(&path, accept, true);
        let address_header = self.leases.as_ref().map(|l| l.address_header.clone());
        let cluster = match self.servers.get_mut(server) {
            Some(s) => {
                if purpose != Purpose::Members {
                    s.work.pending += 1;
                }
                if let Some((etag, _)) = s.cache.get(&path) {
                    headers.push(("if-none-match".to_string(), etag.clone()));
                }
                if let (Some(h), Some(a)) = (address_header, &s.reference.address) {
                    headers.push((h, a.clone()));
                }
                s.reference.cluster.clone()
            }
            None => String::new(),
        };
        self.in_flight.insert(id, InFlight { server, purpose, path });
        Fetch {
            id,
            cluster,
            headers,
            timeout_ms: self.fetch_timeout_ms,
        }
    }

    /// Feeds one answer; returns follow-up fetches, errors, and a snapshot when a round ends.
    pub fn on_response(&mut self, id: u64, outcome: Outcome, now_ms: u64) -> Step {
        let mut step = Step::default();
        if self.local_ready_in(id, &outcome, now_ms, &mut step) {
            return step;
        }
        let Some(InFlight {
            server: si,
            purpose,
            path,
        }) = self.in_flight.remove(&id)
        else {
            return step;
        };
        let name = match self.servers.get(si) {
            Some(s) => s.reference.name.clone(),
            None => return step,
        };
        if purpose == Purpose::Members {
            match self.interpret_members(outcome) {
                Ok(peers) => self.apply_leases(peers, now_ms, &mut step),
                Err((kind, detail)) => step.errors.push(SyncError {
                    server: name,
                    kind,
                    detail: format!("{path}: {detail}"),
                }),
            }
        } else {
            match self.interpret(si, &path, outcome) {
                Ok(doc) => self.absorb(si, purpose, doc, &mut step),
                Err((kind, detail)) => {
                    if let Some(s) = self.servers.get_mut(si) {
                        s.work.unreachable |= kind == SyncErrorKind::Unreachable;
                    }
                    step.errors.push(SyncError {
                        server: name,
                        kind,
                        detail: format!("{path}: {detail}"),
                    });
                    if purpose == Purpose::OpenApiIndex {
                        // The walk follows the last good index (or the APIGroupList alone).
                        self.index_in(si, None, &mut step);
                    }
                }
            }
            if let Some(s) = self.servers.get_mut(si) {
                s.work.pending = s.work.pending.saturating_sub(1);
                if s.work.pending == 0 && s.refetch {
                    s.refetch = false;
                    self.start_server(si, &mut step);
                } else if s.work.pending == 0 {
                    let shared = self.shared_docs(si);
                    if let Some(s) = self.servers.get_mut(si) {
                        self.dirty |= legacy::finish_server(s, now_ms, &shared);
                    }
                }
            }
        }
        if self.in_flight.is_empty() && self.round_deadline_ms.is_some() {
            self.round_deadline_ms = None;
            self.round_completed_ms = Some(now_ms);
            let before = self.servers.len();
            self.servers.retain(|s| !s.leaving);
            self.dirty |= self.servers.len() != before;
            step.publish = self.build(now_ms);
        }
        step
    }
}
