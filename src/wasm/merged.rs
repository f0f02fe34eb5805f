//! A merged discovery answer (see [`crate::request::response`]): the local server answers the
//! request first (authenticating and authorizing it as usual), and only its 200 is replaced by the
//! merged document of the table the request was routed with, whole or piece by piece.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};

use super::host;
use super::worker::{Body, Shared};
use crate::metrics;
use crate::request::forward;
use crate::request::response;
use crate::request::routing::MergedDoc;
use crate::snapshot::Table;

/// A merged discovery answer waiting for the local apiserver's verdict: the local server
/// authenticates and authorizes the request as usual, and only its 200 is replaced.
pub struct MergedReply {
    doc: MergedDoc,
    table: Rc<Table>,
    /// The document of `table`'s generation, taken with it: the VM may load a newer snapshot
    /// before the local server answers, and the body must match the ETag sent.
    source: Body,
    if_none_match: Option<String>,
    /// Headers were rewritten; the local body is being swapped for `body`.
    body: Option<Body>,
}

impl MergedReply {
    /// A merged discovery request: the client's `If-None-Match` is kept for the merged answer and
    /// removed, so the local server answers in full (not 304 on its own ETag), and its
    /// `Accept-Encoding` removed, so that answer is not gzipped (see
    /// [`forward::MERGED_REQUEST_DROPS_ENCODING`]).
    pub fn start(shared: &Shared, doc: MergedDoc, table: Rc<Table>) -> MergedReply {
        let req = MapType::HttpRequestHeaders;
        let if_none_match = host::header(req, forward::MERGED_REQUEST_DROPS);
        if if_none_match.is_some() {
            host::set_header(req, forward::MERGED_REQUEST_DROPS, None);
        }
        if host::header(req, forward::MERGED_REQUEST_DROPS_ENCODING).is_some() {
            host::set_header(req, forward::MERGED_REQUEST_DROPS_ENCODING, None);
        }
        let source = shared.merged(doc, &table);
        MergedReply {
            doc,
            table,
            source,
            if_none_match,
            body: None,
        }
    }

    /// The local server's response headers: on its 200, the merged document's headers (or a 304
    /// when the client already has it). `false`: any other answer, which stands.
    pub fn on_headers(&mut self, shared: &Shared, status: &str) -> bool {
        let local_status = status.parse().unwrap_or(0);
        let Some(h) = response::merged_headers(self.doc, &self.table, self.if_none_match.as_deref(), local_status)
        else {
            return false;
        };
        self.body = Some(if h.status == 304 {
            Body::Whole(Rc::new(Vec::new()))
        } else {
            self.source.clone()
        });
        for (name, value) in h.edits() {
            host::set_header(MapType::HttpResponseHeaders, name, value);
        }
        shared.inc(metrics::MERGED_RESPONSES, &[("doc", h.label), ("code", h.code())]);
        true
    }

    /// A chunk of the local body: dropped (nothing is buffered), and at the end ours is written.
    /// `true` once it is.
    pub fn on_body(&self, body_size: usize, end_of_stream: bool) -> bool {
        let Some(body) = &self.body else { return false };
        if !end_of_stream {
            if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, &[]) {
                log::error!("kube-peer-proxy: cannot drop the local discovery body: {e:?}");
            }
            return false;
        }
        body.write(body_size);
        true
    }
}
