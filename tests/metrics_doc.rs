//! The README's metrics table against the code: every label value the filter and the discovery
//! service emit for `doc` and `type` is listed, and nothing else is.

// Helpers outside #[test] functions: a panic there is a test failure too.
#![allow(clippy::panic)]

use std::collections::BTreeSet;

use kube_peer_proxy::discovery::sync::SyncErrorKind;
use kube_peer_proxy::metrics::{MERGED_RESPONSES, PROXY_ERRORS, SYNC_ERRORS};
use kube_peer_proxy::request::reply::ProxyError;
use kube_peer_proxy::request::response::merged_headers;
use kube_peer_proxy::request::routing::MergedDoc;
use kube_peer_proxy::snapshot::Table;

fn readme(file: &str) -> String {
    std::fs::read_to_string(format!("{}/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The backticked values after `` `label` ( `` in the README row of `metric`, e.g. `doc` (`apis`/`api`).
fn documented(metric: &str, label: &str) -> BTreeSet<String> {
    let text = readme("README.md");
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("| `{metric}` |")))
        .unwrap_or_else(|| panic!("README.md has no metrics row for {metric}"));
    let mut out = BTreeSet::new();
    // Values are `x` tokens: in the labels column after "`label` (", or in the meaning column.
    let cols: Vec<&str> = row.split('|').collect();
    let labels = cols.get(2).copied().unwrap_or("");
    let meaning = cols.get(3).copied().unwrap_or("");
    let src = match labels.split_once(&format!("`{label}` (")) {
        Some((_, rest)) => rest.split(')').next().unwrap_or(""),
        None => meaning,
    };
    for (i, part) in src.split('`').enumerate() {
        if i % 2 == 1 && !part.contains(' ') && part.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            out.insert(part.to_string());
        }
    }
    out
}

fn all_sync_kinds() -> Vec<SyncErrorKind> {
    use SyncErrorKind::*;
    let kinds = vec![Unreachable, Unavailable, Timeout, Reset, HttpStatus, Decode, Oversized];
    // Exhaustive: a new kind does not compile until it is listed above.
    for k in &kinds {
        match k {
            Unreachable | Unavailable | Timeout | Reset | HttpStatus | Decode | Oversized => {}
        }
    }
    kinds
}

#[test]
fn merged_responses_doc_label_values_are_documented() {
    let table = Table::default();
    let emitted: BTreeSet<String> = [MergedDoc::Apis, MergedDoc::Api, MergedDoc::ApisLegacy]
        .into_iter()
        .map(|d| {
            // Exhaustive over MergedDoc for the same reason.
            match d {
                MergedDoc::Apis | MergedDoc::Api | MergedDoc::ApisLegacy => {}
            }
            merged_headers(d, &table, None, 200)
                .map(|h| h.label.to_string())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(documented(MERGED_RESPONSES, "doc"), emitted);
}

#[test]
fn sync_error_type_values_are_documented() {
    let emitted: BTreeSet<String> = all_sync_kinds().into_iter().map(|k| k.label().to_string()).collect();
    assert_eq!(documented(SYNC_ERRORS, "type"), emitted);
}

#[test]
fn proxy_error_type_values_are_documented() {
    let emitted: BTreeSet<String> = ProxyError::ALL
        .into_iter()
        .map(|e| {
            // Exhaustive over ProxyError, so a new kind cannot be left out of ALL unnoticed.
            match e {
                ProxyError::PeerUnavailable | ProxyError::GuardedNotFound | ProxyError::UpstreamUnreachable => {}
            }
            e.label().to_string()
        })
        .collect();
    assert_eq!(emitted.len(), 3, "{emitted:?}");
    assert_eq!(documented(PROXY_ERRORS, "type"), emitted);
}
