//! The local apiserver's readiness, asked every tick with `GET /readyz`, apart from the rounds.
//!
//! A round learns that the local server is down only when its fetches fail, up to a refresh
//! interval (plus a fetch timeout) late, and a starting apiserver answers discovery before it is
//! ready. Meanwhile every request routed to it got Envoy's 503. The real node showed it: while
//! `kubeadm upgrade` restarted a kube-apiserver, clients whose keep-alive connection the load
//! balancer had sent to that node got 503s for longer than client-go retries. A local server that
//! is not ready counts as unhealthy in the table (what a peer serves goes to that peer, see
//! [`crate::request::routing`]) from the first failed probe, about a second, and until a probe
//! answers 200 again. Upstream has no equivalent: its proxy runs inside the apiserver it would
//! otherwise probe.

use super::{Fetch, Outcome, Step, Syncer};

/// The path probed: kube-apiserver's readiness, readable by anyone (`system:public-info-viewer`).
pub const READYZ_PATH: &str = "/readyz";

/// The probe's timeout: short, so a hung server is noticed within about a tick.
const PROBE_TIMEOUT_MS: u64 = 1000;

#[derive(Debug)]
pub(super) struct LocalReady {
    /// Whether the last answered probe found the local server ready (true until one says not).
    pub ready: bool,
    /// The probe in flight: its fetch id and when it was sent.
    probe: Option<(u64, u64)>,
}

impl Default for LocalReady {
    fn default() -> Self {
        LocalReady {
            ready: true,
            probe: None,
        }
    }
}

/// Whether a probe's answer says the local server is ready: only a 200 does. A starting
/// kube-apiserver answers 403 to everyone not in `system:masters` until its authorizer has synced
/// (the real node: the probe took such a 403 for "ready", and clients got 403s for a second), and
/// every authenticated identity may read `/readyz` (`system:public-info-viewer`), so a 401 or 403
/// means this server cannot serve the probe's identity either. Envoy's own 503 (cannot connect),
/// a 5xx of the server (not ready, shutting down), a reset or no answer in time are not ready either.
pub fn ready(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Response { status: 200, .. })
}

impl Syncer {
    /// Sends the tick's probe unless one is still waiting (a probe that never came back is
    /// forgotten after a few timeouts: the host answers every call, this only guards the state).
    pub(super) fn probe_local(&mut self, now_ms: u64, step: &mut Step) {
        let timeout_ms = self.fetch_timeout_ms.min(PROBE_TIMEOUT_MS);
        if let Some((_, sent)) = self.local_ready.probe {
            if now_ms.saturating_sub(sent) < timeout_ms.saturating_mul(3) {
                return;
            }
        }
        let Some(local) = self.servers.iter().find(|s| s.reference.local) else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let headers = self.get_headers(READYZ_PATH, "text/plain", false);
        step.probe = Some(Fetch {
            id,
            cluster: local.reference.cluster.clone(),
            headers,
            timeout_ms,
        });
        self.local_ready.probe = Some((id, now_ms));
    }

    /// Takes the probe's answer, if `id` is the probe. A change is published at once; ready again,
    /// the next tick starts a round, so the local server's discovery (perhaps another version's now)
    /// is fetched again without waiting for the refresh interval.
    pub(super) fn local_ready_in(&mut self, id: u64, outcome: &Outcome, now_ms: u64, step: &mut Step) -> bool {
        if self.local_ready.probe.map(|(p, _)| p) != Some(id) {
            return false;
        }
        self.local_ready.probe = None;
        let ready = ready(outcome);
        if ready != self.local_ready.ready {
            self.local_ready.ready = ready;
            self.dirty = true;
            if ready {
                log::info!("kube-peer-proxy: the local apiserver is ready again; requests go to it");
                self.next_round_ms = now_ms;
            } else {
                log::warn!(
                    "kube-peer-proxy: the local apiserver is not ready ({}); what a peer serves goes to that peer",
                    describe(outcome)
                );
            }
            step.publish = self.build(now_ms);
        }
        true
    }

    /// Whether the local server last answered its readiness probe as ready.
    pub fn local_ready(&self) -> bool {
        self.local_ready.ready
    }
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Response { status, .. } => format!("{READYZ_PATH} answered {status}"),
        Outcome::Unreachable => "cannot connect".into(),
        Outcome::NoResponse => "no response".into(),
        Outcome::Overdue => "no answer in time".into(),
        Outcome::Oversized => "oversized answer".into(),
    }
}
