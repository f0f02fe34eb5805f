//! The response phase of the request walk, decided here and carried out by the filter: the headers
//! of a merged discovery answer (and when it is a 304), and where its body is published.

use crate::discovery::documents::CONTENT_TYPE_V2;
use crate::request::routing::MergedDoc;
use crate::snapshot::Table;

/// Where a merged document is published: its shared-data key and its index in
/// [`Table::merged_lengths`].
pub fn merged_source(doc: MergedDoc) -> (&'static str, usize) {
    match doc {
        MergedDoc::Apis => (crate::snapshot::KEY_MERGED_APIS, 0),
        MergedDoc::Api => (crate::snapshot::KEY_MERGED_API, 1),
        MergedDoc::ApisLegacy => (crate::snapshot::KEY_MERGED_APIS_LEGACY, 2),
    }
}

/// How the local server's 200 for a merged discovery request is rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedHeaders {
    /// 200 with the merged body, or 304 without a body.
    pub status: u16,
    pub content_type: &'static str,
    pub etag: String,
    /// The `doc` label of `merged_discovery_responses_total`.
    pub label: &'static str,
}

impl MergedHeaders {
    /// The response header edits, in order (`None` removes): the local answer's length and encoding
    /// go (the body is replaced, uncompressed), then the merged document's headers, then `:status`
    /// for a 304.
    pub fn edits(&self) -> Vec<(&'static str, Option<&str>)> {
        let mut edits = vec![
            ("content-length", None),
            ("content-encoding", None),
            ("content-type", Some(self.content_type)),
            ("etag", Some(self.etag.as_str())),
            ("vary", Some("Accept")),
            ("cache-control", Some("public")),
        ];
        if self.status == 304 {
            edits.push((":status", Some("304")));
        }
        edits
    }

    /// The `code` label of `merged_discovery_responses_total`.
    pub fn code(&self) -> &'static str {
        if self.status == 304 {
            "304"
        } else {
            "200"
        }
    }
}

/// The reply to a merged discovery request once the local server answered `local_status`: `None`
/// keeps the local answer (401, 403, 406, ...: the apiserver's verdict stands). `Vary: Accept` and
/// `Cache-Control: public` always go with it, as upstream's peer-aggregated handler sets them.
pub fn merged_headers(
    doc: MergedDoc,
    table: &Table,
    if_none_match: Option<&str>,
    local_status: u16,
) -> Option<MergedHeaders> {
    if local_status != 200 {
        return None;
    }
    let (etag, label, content_type) = match doc {
        MergedDoc::Apis => (&table.apis_etag, "apis", CONTENT_TYPE_V2),
        MergedDoc::Api => (&table.api_etag, "api", CONTENT_TYPE_V2),
        MergedDoc::ApisLegacy => (&table.apis_legacy_etag, "apis_legacy", "application/json"),
    };
    // Exact string equality, like upstream (no weak ETags, no lists).
    let status = if if_none_match == Some(etag.as_str()) { 304 } else { 200 };
    Some(MergedHeaders {
        status,
        content_type,
        etag: etag.clone(),
        label,
    })
}
