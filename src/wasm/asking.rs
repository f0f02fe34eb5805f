//! The 404 guard's adapter: carries out the steps of a [`Conversation`] (see
//! [`crate::request::guard`]) for a paused 404: the discovery calls it asks for, their answers, and
//! its verdict (the 404 stands and the response resumes, or a 503 replaces it).

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};

use super::host;
use super::worker::Shared;
use crate::request::guard::{Call, Conversation, Step, Verdict};
use crate::request::reply::LocalReply;
use crate::snapshot::Table;

/// Where a conversation is after its steps were carried out.
pub enum Progress {
    /// It waits for the answers of the calls it made.
    Waiting(Asking),
    /// It ended; for [`Verdict::Unavailable`] the 503 is sent.
    Done(Verdict),
}

/// A 404's conversation and the host's token of each call it made.
pub struct Asking {
    conversation: Conversation,
    tokens: Vec<(u32, usize)>,
}

impl Asking {
    /// Carries out the conversation's first step.
    pub fn start(shared: &Shared, conversation: Conversation, step: Step, table: Option<&Table>) -> Progress {
        let asking = Asking {
            conversation,
            tokens: Vec::new(),
        };
        asking.carry_out(shared, step, table)
    }

    /// One call's answer (a token it did not make leaves it waiting).
    pub fn on_answer(mut self, shared: &Shared, token: u32, num_headers: usize, body_size: usize) -> Progress {
        let Some(id) = self
            .tokens
            .iter()
            .position(|(t, _)| *t == token)
            .map(|i| self.tokens.swap_remove(i).1)
        else {
            return Progress::Waiting(self);
        };
        let status = if num_headers == 0 {
            0
        } else {
            host::header(MapType::HttpCallResponseHeaders, ":status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        let body = host::buffer(BufferType::HttpCallResponseBody, body_size);
        let table = shared.table();
        let step = self.conversation.on_answer(id, status, &body, table.as_deref());
        self.carry_out(shared, step, table.as_deref())
    }

    /// Carries out the steps until the conversation waits or has a verdict (a 503 is sent here). A
    /// call that cannot be made is answered at once, with no answer.
    fn carry_out(mut self, shared: &Shared, mut step: Step, table: Option<&Table>) -> Progress {
        let mut unasked = Vec::new();
        loop {
            match step {
                Step::Ask(calls) => {
                    for call in calls {
                        match ask(shared, &call) {
                            Some(token) => self.tokens.push((token, call.id)),
                            None => unasked.push(call.id),
                        }
                    }
                }
                Step::Wait => {}
                Step::Verdict(verdict) => {
                    if verdict == Verdict::Unavailable {
                        self.unavailable(shared);
                    }
                    return Progress::Done(verdict);
                }
            }
            let Some(id) = unasked.pop() else {
                return Progress::Waiting(self);
            };
            step = self.conversation.on_answer(id, 0, &[], table);
        }
    }

    /// A 404 that might be false: 503 with Retry-After and the apiserver's `Audit-Id`.
    fn unavailable(&self, shared: &Shared) {
        let gvr = &self.conversation.question().gvr;
        log::info!("kube-peer-proxy: a 404 for {gvr:?} might be false; answering 503");
        let audit_id = host::header(MapType::HttpResponseHeaders, "audit-id");
        let reply = LocalReply::guarded_not_found(gvr, shared.config.retry_after_seconds, audit_id);
        let _ = shared.send(&reply, Some(gvr));
    }
}

/// Makes one discovery call for the guard; `None` if it cannot be made.
fn ask(shared: &Shared, call: &Call) -> Option<u32> {
    let config = &shared.config;
    let cluster = &call.target.cluster;
    match hostcalls::dispatch_http_call(cluster, call.headers(config), None, vec![], config.fetch_timeout) {
        Ok(token) => Some(token),
        Err(e) => {
            log::warn!("kube-peer-proxy: cannot ask {cluster} about a 404: {e:?}");
            None
        }
    }
}
