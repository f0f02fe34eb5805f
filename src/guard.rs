//! The 404 guard: a request goes where the table says (the local apiserver first), and a 404 that
//! means "this resource type is not served here" is let through only when it is not false.
//!
//! * **Strict** (the table says a peer serves the resource, the request went to a peer, or some
//!   member's API set is unknown): such a 404 becomes a 503 `Status` with `Retry-After`.
//! * **Verified** (nobody else is known to serve it): such a 404 stands only if no other member
//!   serves the resource *now*. Each other member's discovery of that group/version is asked while
//!   the 404 waits; one that lists it (it came back as another version since the last round) turns
//!   the 404 into a 503. A member that cannot be asked counts with what it was last seen to serve.
//!
//! A 404 for a missing object always stands. kube-apiserver writes "not served here" two ways (see
//! [`crate::not_found`] for the sources): the not-found handler's `text/plain` 404 (unknown
//! group/version or CRD version), which settles it from the headers, and go-restful's `Status` 404
//! for an unknown resource of a served group/version, which looks like an object's 404 from the
//! headers. Envoy never shows a proxy-wasm filter a response body before it has released the
//! headers (proxy-wasm turns a paused response into `StopAllIterationAndWatermark`), so for a
//! `Status` 404 the answering server's own discovery is asked as well, and [`listed`] decides.

use crate::discovery;
use crate::not_found::{self, NotFound};
use crate::request_info::{self, NonResource, RequestKind};
use crate::routing::Gvr;
use crate::snapshot::{self, Table};

/// Which discovery document tells whether a request's type is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// `/api/<v>`, `/apis/<g>/<v>` or `/apis/<g>`.
    pub path: String,
    /// `resource` or `resource/subresource` as an `APIResourceList` names it; `None` when the
    /// request is for the discovery document itself (then a 200 means "served").
    pub name: Option<String>,
    /// The metric labels and `Status` details of a 503.
    pub gvr: Gvr,
}

/// The question for a request, or `None` for requests no 404 guard applies to. A subresource is
/// asked about as such if some server is known to serve it or some member's API set is unknown;
/// otherwise the request was routed on its parent resource (see [`crate::routing`]) and the parent
/// is asked about.
pub fn question(method: &str, path: &str, table: Option<&Table>) -> Option<Question> {
    let gv = |g: &str, v: &str| Gvr {
        group: g.to_string(),
        version: v.to_string(),
        resource: String::new(),
    };
    let mut decoded = String::new();
    match request_info::parse_decoded(method, path, &mut decoded) {
        RequestKind::Resource(r) => {
            // While some member's API set there is unknown, that member may serve the subresource.
            let sub_known = table.is_none_or(|t| {
                t.incomplete(r.group, r.version)
                    || t.servers_for(&snapshot::subresource_key(
                        r.group,
                        r.version,
                        r.resource,
                        r.subresource,
                    )) != 0
            });
            let name = if r.subresource.is_empty() || !sub_known {
                r.resource.to_string()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            Some(Question {
                path: discovery_path(r.group, r.version),
                name: Some(name),
                gvr: Gvr {
                    group: r.group.to_string(),
                    version: r.version.to_string(),
                    resource: r.resource.to_string(),
                },
            })
        }
        RequestKind::NonResource(NonResource::CoreVersion(v)) => Some(Question {
            path: discovery_path("", v),
            name: None,
            gvr: gv("", v),
        }),
        RequestKind::NonResource(NonResource::GroupVersion(g, v)) => Some(Question {
            path: discovery_path(g, v),
            name: None,
            gvr: gv(g, v),
        }),
        RequestKind::NonResource(NonResource::Group(g)) => Some(Question {
            path: format!("/apis/{g}"),
            name: None,
            gvr: gv(g, ""),
        }),
        _ => None,
    }
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
            let list = discovery::parse_resource_list(body).ok()?;
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
