//! Interpreting answers: what a discovery call's HTTP answer says (a document, a 304 for the cached
//! one, or a failure and its [`SyncErrorKind`]), and which document a path's body is.

use std::rc::Rc;

use super::{Body, Doc, Outcome, SyncErrorKind, Syncer};
use crate::discovery::{documents, openapi_index};

/// A discovery call's answer. Envoy's router stamps every upstream answer with
/// `x-envoy-upstream-service-time`; its own 503 for a connect failure lacks it, and that is the
/// only failure that marks a server unreachable.
pub fn call_outcome(
    status: u16,
    upstream_service_time: bool,
    content_type: String,
    etag: Option<String>,
    body: Body,
) -> Outcome {
    if status == 503 && !upstream_service_time {
        return Outcome::Unreachable;
    }
    Outcome::Response {
        status,
        content_type,
        etag,
        body,
    }
}

impl Syncer {
    /// The error for an outcome without a usable HTTP response.
    pub(super) fn no_answer(&self, outcome: Outcome) -> (SyncErrorKind, String) {
        match outcome {
            Outcome::Unreachable => (SyncErrorKind::Unreachable, "cannot connect".into()),
            Outcome::NoResponse | Outcome::Response { .. } => (SyncErrorKind::Reset, "no response".into()),
            Outcome::Overdue => (SyncErrorKind::Timeout, "no answer before the round's deadline".into()),
            Outcome::Oversized => (
                SyncErrorKind::Oversized,
                format!("body larger than {} bytes", self.max_bytes),
            ),
        }
    }

    /// Turns an HTTP outcome into a parsed document (or the cached one for a 304).
    pub(super) fn interpret(
        &mut self,
        si: usize,
        path: &str,
        outcome: Outcome,
    ) -> Result<Doc, (SyncErrorKind, String)> {
        let (status, content_type, etag, body) = match outcome {
            Outcome::Response {
                status,
                content_type,
                etag,
                body,
            } => (status, content_type, etag, body),
            failed => return Err(self.no_answer(failed)),
        };
        // The document another server holds under the same ETag (apiservers hash what they send),
        // shared instead of parsed: during an upgrade most servers send the same bytes.
        let same = match (status, etag.as_deref()) {
            (200, Some(t)) if !t.is_empty() && documents::is_aggregated_content_type(&content_type) => {
                self.servers.iter().enumerate().find_map(|(i, o)| {
                    let part = match path {
                        "/api" => &o.core,
                        "/apis" => &o.groups,
                        _ => return None,
                    };
                    (i != si && part.etag.as_deref() == Some(t))
                        .then(|| part.docs.clone())
                        .flatten()
                })
            }
            _ => None,
        };
        let parsed = match (status, same) {
            (200, _) if body.len() > self.max_bytes => {
                return Err((SyncErrorKind::Oversized, format!("body of {} bytes", body.len())));
            }
            (200, Some(docs)) => Some(Doc::Aggregated(docs, None)),
            // Groups every member's current documents have too are shared, not copied.
            (200, None) if documents::is_aggregated_content_type(&content_type) => Some(
                documents::sharing(
                    self.servers
                        .iter()
                        .flat_map(|o| [&o.core.docs, &o.groups.docs])
                        .flatten()
                        .map(|d| d.as_slice()),
                    || parse_doc(path, &content_type, &body),
                )
                .map_err(|e| (SyncErrorKind::Decode, e))?,
            ),
            (200, None) => Some(parse_doc(path, &content_type, &body).map_err(|e| (SyncErrorKind::Decode, e))?),
            _ => None,
        };
        let server = self
            .servers
            .get_mut(si)
            .ok_or((SyncErrorKind::Reset, "unknown server".to_string()))?;
        match status {
            304 => server
                .cache
                .get(path)
                .map(|(_, d)| d.clone())
                .ok_or((SyncErrorKind::HttpStatus, "304 without a cached document".into())),
            200 => {
                let doc = parsed.ok_or((SyncErrorKind::Decode, "no document".to_string()))?;
                let doc = match (doc, &etag) {
                    (Doc::Aggregated(docs, _), Some(t)) if !t.is_empty() => Doc::Aggregated(docs, Some(t.clone())),
                    (doc, _) => doc,
                };
                match etag {
                    Some(t) if !t.is_empty() => {
                        let cached = match &doc {
                            Doc::Aggregated(..) => Doc::Unchanged,
                            other => other.clone(),
                        };
                        server.cache.insert(path.to_string(), (t, cached));
                    }
                    _ => {
                        server.cache.remove(path);
                    }
                }
                Ok(doc)
            }
            404 if path == "/api" || is_version_path(path) => Ok(Doc::Absent),
            503 => Err((SyncErrorKind::Unavailable, "HTTP 503".into())),
            504 => Err((SyncErrorKind::Timeout, "HTTP 504".into())),
            other => Err((SyncErrorKind::HttpStatus, format!("HTTP {other}"))),
        }
    }
}

/// `/api/<v>` or `/apis/<g>/<v>`: a legacy walk's group version.
fn is_version_path(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["api", _] | ["apis", _, _])
}

fn parse_doc(path: &str, content_type: &str, body: &Body) -> Result<Doc, String> {
    let e = |e: documents::ParseError| e.to_string();
    if documents::is_aggregated_content_type(content_type) {
        // Read in pieces from where the body is: no copy of a large document beside its parse.
        let list = documents::parse_aggregated_from(body.reader()).map_err(e)?;
        return Ok(Doc::Aggregated(Rc::new(list.items), None));
    }
    if let Some(v) = documents::unsupported_aggregated_version(content_type) {
        return Err(format!(
            "unsupported aggregated discovery version {v} (Content-Type {content_type}); this filter reads v2 and v2beta1 (the last good data is kept)"
        ));
    }
    // Legacy documents are small (one group version each): parsed from a copy.
    let body = &body.to_vec();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["openapi", "v3"] => Ok(Doc::OpenApiIndex(openapi_index::parse_openapi_index(body)?)),
        ["api"] => Ok(Doc::ApiVersions(
            documents::parse_api_versions(body).map_err(e)?.versions,
        )),
        ["apis"] => Ok(Doc::GroupList(
            documents::parse_group_list(body)
                .map_err(e)?
                .groups
                .into_iter()
                .map(|g| (g.name, g.versions.into_iter().map(|v| v.version).collect()))
                .collect(),
        )),
        ["api", v] | ["apis", _, v] => {
            let list = documents::parse_resource_list(body).map_err(e)?;
            Ok(Doc::ResourceList(documents::version_from_legacy(v, &list)))
        }
        _ => Err(format!("unexpected discovery path {path}")),
    }
}
