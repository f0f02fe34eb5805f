//! The local-first 404 guard: a request goes to the apiserver the table names (the local one
//! first), and when the answer is a 404 that might be false — the resource type is not served
//! there, but a peer serves it or some apiserver's API set is not known yet — it becomes a 503
//! `Status` with `Retry-After` instead. A 404 for a missing object always stands.
//!
//! kube-apiserver writes "not served here" two ways (see [`crate::not_found`] for the sources): its
//! not-found handler's `text/plain` 404 (unknown group/version or CRD version), which settles it from
//! the headers, and go-restful's `Status` 404 for an unknown resource of a served group/version,
//! which looks like an object's 404 from the headers. Envoy never shows a proxy-wasm filter a
//! response body before it has released the headers (proxy-wasm turns a paused response into
//! `StopAllIterationAndWatermark`), so for a `Status` 404 the filter asks the same server's
//! discovery for that group/version while the headers wait, and [`resource_listed`] decides.

use crate::discovery;
use crate::not_found;
use crate::request_info::{self, RequestKind};
use crate::snapshot::{self, Table};

/// What to do with a 404 of a guarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On404 {
    /// The type is not served there: answer 503.
    Unavailable,
    /// Could be a missing object: ask the server's discovery (see [`Question`]).
    Ask,
}

/// The first look, from the response's content type and the request.
pub fn on_404(content_type: &str, question: Option<&Question>) -> On404 {
    match (not_found::needs_body(content_type), question) {
        // `text/plain`: the not-found handler. Other non-Status types are not kube-apiserver's
        // 404s for a served type either; without a resource to ask about, nothing can be a
        // missing object.
        (false, _) if not_found::classify(content_type, &[]) == not_found::NotFound::TypeNotServed => {
            On404::Unavailable
        }
        (_, None) => On404::Unavailable,
        (_, Some(_)) => On404::Ask,
    }
}

/// Which discovery document tells whether a resource request's type is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// `/api/<v>` or `/apis/<g>/<v>`.
    pub path: String,
    /// `resource` or `resource/subresource`, as an `APIResourceList` names it.
    pub name: String,
}

/// The question for a request, or `None` for requests that are not about a resource. A
/// subresource is asked about as such only if some server is known to serve it; otherwise the
/// request was routed on its parent resource (see [`crate::routing`]) and the parent is asked about.
pub fn question(method: &str, path: &str, table: Option<&Table>) -> Option<Question> {
    let RequestKind::Resource(r) = request_info::parse(method, path) else {
        return None;
    };
    let sub_known = table.is_none_or(|t| {
        t.servers_for(&snapshot::subresource_key(
            r.group,
            r.version,
            r.resource,
            r.subresource,
        )) != 0
    });
    let path = if r.group.is_empty() {
        format!("/api/{}", r.version)
    } else {
        format!("/apis/{}/{}", r.group, r.version)
    };
    let name = if r.subresource.is_empty() || !sub_known {
        r.resource.to_string()
    } else {
        format!("{}/{}", r.resource, r.subresource)
    };
    Some(Question { path, name })
}

/// The answer to a [`Question`], from the discovery response: `true` if the server lists the
/// resource (so its 404 is about an object and stands), `false` if it does not or does not serve
/// the group/version at all (404), `None` if the answer is unusable (the 404 is then treated as
/// possibly false: a 503 costs a retry, a false 404 can cost data).
pub fn resource_listed(status: u16, body: &[u8], name: &str) -> Option<bool> {
    match status {
        200 => {
            let list = discovery::parse_resource_list(body).ok()?;
            Some(list.resources.iter().any(|r| r.name == name))
        }
        404 => Some(false),
        _ => None,
    }
}
