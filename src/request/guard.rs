//! The 404 guard: a request goes where the table says (the local apiserver first), and a 404 that
//! means "this resource type is not served here" is let through only when it is not false.
//!
//! * **Strict** (the table says a peer serves the resource, the request went to a peer, or some
//!   member's API set is unknown): such a 404 becomes a 503 `Status` with `Retry-After`.
//! * **Verified** (nobody else is known to serve it): such a 404 stands only if no other member
//!   serves the resource *now*. Each other member's discovery of that group/version is asked while
//!   the 404 waits; one that lists it (it came back as another version since the last round) turns
//!   the 404 into a 503; one that does not answer does not. The answering server, when its own
//!   discovery cannot be asked, counts with what the table last saw it serve (`last_seen`).
//!   With more than [`MAX_ASKED`] other members the 404 is a 503 without asking.
//!
//! A 404 for a missing object always stands. kube-apiserver writes "not served here" two ways (see
//! [`crate::request::not_found`] for the sources): the not-found handler's `text/plain` 404 (unknown
//! group/version or CRD version), which settles it from the headers, and go-restful's `Status` 404
//! for an unknown resource of a served group/version, which looks like an object's 404 from the
//! headers. Envoy never shows a proxy-wasm filter a response body before it has released the
//! headers (proxy-wasm turns a paused response into `StopAllIterationAndWatermark`), so for a
//! `Status` 404 the answering server's own discovery is asked as well, and [`listed`] decides.
//!
//! The conversation is a pure state machine, like [`crate::discovery::sync::Syncer`]: the routing
//! decision carries a [`Guard`] (its [`Mode`] and its [`Subject`]); on a 404, [`Conversation::start`]
//! returns a [`Step`] (a [`Verdict`], or discovery [`Call`]s to make), and each answer fed to
//! [`Conversation::on_answer`] returns the next one. The adapter only makes the calls and sends
//! the verdict.

use crate::config::Config;
use crate::discovery::documents;
use crate::request::not_found::{self, NotFound};
use crate::request::request_info;
use crate::request::routing::{Guard, Gvr, Kind, Mode, Subject};
use crate::snapshot::{self, Table};
use crate::PEER_PROXIED_HEADER;

/// At most this many other members are asked about one 404; with more, the 404 is answered 503.
pub const MAX_ASKED: usize = 16;

/// Which discovery document tells whether a request's type is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// `/api/<v>`, `/apis/<g>/<v>` or `/apis/<g>`.
    pub path: String,
    /// `resource` or `resource/subresource` as an `APIResourceList` names it; `None` when the
    /// request is for the discovery document itself (then a 200 means "served").
    pub name: Option<String>,
    /// The metric labels and `Status` details of a 503.
    pub gvr: Gvr<'static>,
}

/// The question a 404 asks about `subject`, with the table at the time of the 404. A subresource
/// is asked about as such if some server is known to serve it or some member's API set is
/// unknown; otherwise the request was routed on its parent resource (see [`crate::request::routing`]) and
/// the parent is asked about.
pub fn question_about(subject: &Subject, table: Option<&Table>) -> Question {
    let g = &subject.gvr;
    let name = match subject.kind {
        Kind::Document => None,
        Kind::Resource if subject.subresource.is_empty() => Some(g.resource.to_string()),
        Kind::Resource => {
            // While some member's API set there is unknown, that member may serve the subresource.
            let sub_known = table.is_none_or(|t| {
                t.incomplete(&g.group, &g.version)
                    || t.servers_for(&snapshot::subresource_key(
                        &g.group,
                        &g.version,
                        &g.resource,
                        &subject.subresource,
                    )) != 0
            });
            Some(if sub_known {
                format!("{}/{}", g.resource, subject.subresource)
            } else {
                g.resource.to_string()
            })
        }
    };
    let path = if subject.kind == Kind::Document && g.version.is_empty() {
        format!("/apis/{}", g.group)
    } else {
        discovery_path(&g.group, &g.version)
    };
    Question {
        path,
        name,
        gvr: g.clone().into_owned(),
    }
}

/// The question for a request, or `None` for requests no 404 guard applies to (see
/// [`question_about`]).
pub fn question(method: &str, path: &str, table: Option<&Table>) -> Option<Question> {
    let mut decoded = String::new();
    let kind = request_info::parse_decoded(method, path, &mut decoded);
    Subject::of(&kind).map(|s| question_about(&s, table))
}

impl Question {
    /// The table key of what is asked about (see [`snapshot::resource_key`] and friends).
    pub fn table_key(&self) -> String {
        let g = &self.gvr;
        match (&self.name, g.version.is_empty()) {
            (None, true) => snapshot::group_key(&g.group),
            (None, false) => snapshot::version_key(&g.group, &g.version),
            (Some(name), _) => match name.split_once('/') {
                Some((res, sub)) => snapshot::subresource_key(&g.group, &g.version, res, sub),
                None => snapshot::resource_key(&g.group, &g.version, name),
            },
        }
    }
}

fn discovery_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    }
}

/// What the headers of a 404 say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// The type is not served by the server that answered.
    TypeNotServed,
    /// Could be a missing object: the answering server's discovery must be asked.
    AskServer,
}

/// The first look at a 404, from its content type and the question.
pub fn first_look(content_type: &str, question: &Question) -> First {
    if question.name.is_none() {
        // A discovery document's 404 has no object behind it.
        return First::TypeNotServed;
    }
    match (
        not_found::needs_body(content_type),
        not_found::classify(content_type, &[]),
    ) {
        (false, NotFound::TypeNotServed) => First::TypeNotServed,
        _ => First::AskServer,
    }
}

/// Whether a server's discovery answer says it serves what `question` asks about: `Some(true)` if
/// it lists the resource (or, for a discovery document, answers 200), `Some(false)` if it does not
/// or does not serve the group/version at all (404), `None` if the answer is unusable (the server
/// could not be asked).
pub fn listed(question: &Question, status: u16, body: &[u8]) -> Option<bool> {
    match (status, &question.name) {
        (200, None) => Some(true),
        (200, Some(name)) => {
            let list = documents::parse_resource_list(body).ok()?;
            Some(list.resources.iter().any(|r| &r.name == name))
        }
        (404, _) => Some(false),
        _ => None,
    }
}

/// The verdict once the asked servers answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The 404 stands (a missing object, or a type nobody serves).
    Stand,
    /// 503 with Retry-After: the 404 might be false.
    Unavailable,
}

/// `answering`: what the answering server's discovery said (`Some(false)` when its 404 already
/// said "type not served"); `last_seen`: whether the table says the answering server serves it,
/// which stands in when its discovery cannot be asked (e.g. the discovery credential is refused:
/// then an object's 404 must still pass, or Get-then-Create controllers stall); `strict`: see the
/// module doc; `others`: what each other member said.
pub fn verdict(answering: Option<bool>, last_seen: bool, strict: bool, others: &[Option<bool>]) -> Verdict {
    match answering.or(Some(last_seen).filter(|l| *l)) {
        Some(true) => Verdict::Stand,
        None => Verdict::Unavailable,
        Some(false) if strict => Verdict::Unavailable,
        Some(false) if others.contains(&Some(true)) => Verdict::Unavailable,
        Some(false) => Verdict::Stand,
    }
}

/// A server as the table names it: its cluster and, for a lease peer, its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub cluster: String,
    pub address: Option<String>,
}

impl Target {
    fn is(&self, s: &snapshot::ServerRef) -> bool {
        s.cluster == self.cluster && s.address == self.address
    }
}

/// A discovery request the adapter must make, answered with [`Conversation::on_answer`] under `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub id: usize,
    pub target: Target,
    /// The discovery document asked for ([`Question::path`]).
    pub path: String,
}

impl Call {
    /// The request headers: a discovery GET marked as already proxied, so the asked server's own
    /// filter answers it locally.
    pub fn headers<'a>(&'a self, config: &'a Config) -> Vec<(&'a str, &'a str)> {
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "GET"),
            (":path", &self.path),
            (":authority", &config.discovery_authority),
            ("accept", "application/json"),
            (PEER_PROXIED_HEADER, "true"),
        ];
        headers.extend(config.discovery_headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let (Some(l), Some(a)) = (&config.lease_discovery, &self.target.address) {
            headers.push((&l.address_header, a));
        }
        headers
    }
}

/// What the adapter does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Make these calls (a call that cannot be made is answered with status 0) and keep the 404 waiting.
    Ask(Vec<Call>),
    /// Keep the 404 waiting for the calls already made.
    Wait,
    /// Done: the 404 stands or becomes a 503.
    Verdict(Verdict),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Waiting,
    Got(Option<bool>),
}

/// One 404's conversation with the members' discovery. Call `0` is the answering server; the
/// other members are `1..`.
#[derive(Debug, Clone)]
pub struct Conversation {
    question: Question,
    mode: Mode,
    /// The table says the answering server serves what the question asks about.
    last_seen: bool,
    answered_by: Target,
    answering: Answer,
    others: Vec<Answer>,
    others_asked: bool,
}

impl Conversation {
    /// A 404 arrived from `answered_by` for a request guarded by `guard`; `table` is the newest
    /// snapshot. Returns the conversation and its first step.
    pub fn start(guard: &Guard, answered_by: Target, content_type: &str, table: Option<&Table>) -> (Self, Step) {
        let question = question_about(&guard.subject, table);
        let last_seen = table.is_some_and(|t| {
            let bit = t
                .servers
                .iter()
                .position(|s| answered_by.is(s))
                .map_or(0, snapshot::bit);
            t.servers_for(&question.table_key()) & bit != 0
        });
        let first = first_look(content_type, &question);
        let mut c = Conversation {
            question,
            mode: guard.mode,
            last_seen,
            answered_by,
            answering: match first {
                First::TypeNotServed => Answer::Got(Some(false)),
                First::AskServer => Answer::Waiting,
            },
            others: Vec::new(),
            others_asked: false,
        };
        let step = match first {
            First::AskServer => Step::Ask(vec![c.call(0, c.answered_by.clone())]),
            First::TypeNotServed => c.next(table),
        };
        (c, step)
    }

    /// One call's answer (`status` 0: no answer, e.g. a connect failure or a call that could not
    /// be made); `table` is the newest snapshot, whose members are asked if the answer calls for it.
    /// An unknown or repeated `id` changes nothing.
    pub fn on_answer(&mut self, id: usize, status: u16, body: &[u8], table: Option<&Table>) -> Step {
        let slot = match id.checked_sub(1) {
            None => Some(&mut self.answering),
            Some(i) => self.others.get_mut(i),
        };
        match slot {
            Some(slot) if *slot == Answer::Waiting => *slot = Answer::Got(listed(&self.question, status, body)),
            _ => return Step::Wait,
        }
        self.next(table)
    }

    /// The question being asked; its `gvr` labels the 503.
    pub fn question(&self) -> &Question {
        &self.question
    }

    fn next(&mut self, table: Option<&Table>) -> Step {
        if self.needs_others() {
            self.others_asked = true;
            let others: Vec<Target> = table
                .iter()
                .flat_map(|t| t.servers.iter())
                .filter(|s| !self.answered_by.is(s))
                .map(|s| Target {
                    cluster: s.cluster.clone(),
                    address: s.address.clone(),
                })
                .collect();
            if others.len() > MAX_ASKED {
                return Step::Verdict(Verdict::Unavailable);
            }
            if !others.is_empty() {
                self.others = vec![Answer::Waiting; others.len()];
                let calls = others
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| self.call(i + 1, t))
                    .collect();
                return Step::Ask(calls);
            }
        }
        if std::iter::once(&self.answering)
            .chain(&self.others)
            .any(|a| *a == Answer::Waiting)
        {
            return Step::Wait;
        }
        let got = |a: &Answer| match a {
            Answer::Got(v) => *v,
            Answer::Waiting => None,
        };
        let others: Vec<Option<bool>> = self.others.iter().map(got).collect();
        Step::Verdict(verdict(
            got(&self.answering),
            self.last_seen,
            self.mode == Mode::Strict,
            &others,
        ))
    }

    /// Verified mode asks the other members only once the answering server's own answer says
    /// "type not served" (an object's 404, the common case, costs one question).
    fn needs_others(&self) -> bool {
        let answer = match self.answering {
            Answer::Got(a) => a.or(Some(self.last_seen).filter(|l| *l)),
            Answer::Waiting => return false,
        };
        self.mode == Mode::Verified && !self.others_asked && answer == Some(false)
    }

    fn call(&self, id: usize, target: Target) -> Call {
        Call {
            id,
            target,
            path: self.question.path.clone(),
        }
    }
}
