//! The per-VM state of the HTTP filter, shared by every request on a worker: the serving table's
//! head in a cache (a request reads the small generation key and the entries it looks up, and the
//! worker's timer decodes a new head before requests need it), this VM's copies of the merged
//! documents, and metric ids. The peers' passive-health marks are not cached: a rerouted request
//! reads each candidate's mark, so one worker's mark holds on all of them at once.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{Action, BufferType};

use super::host::{self, Metrics};
use crate::config::Config;
use crate::metrics;
use crate::passive_health;
use crate::request::guard::Target;
use crate::request::identity::StrippedNames;
use crate::request::reply::LocalReply;
use crate::request::response;
use crate::request::routing::Gvr;
use crate::request::routing::MergedDoc;
use crate::snapshot::{self, KeySource, Table};

/// Per-VM state shared by every request on this worker.
pub struct Shared {
    pub config: Config,
    /// `config.client_identity`'s names clients must not send, prepared once.
    pub stripped: Option<StrippedNames>,
    cache: RefCell<Cache>,
    metrics: RefCell<Metrics>,
    rng: Cell<u64>,
}

#[derive(Default)]
struct Cache {
    generation: Option<u64>,
    /// The CAS of [`snapshot::KEY_PUBLISHED`] when this VM last took a table.
    published: Option<u32>,
    table: Option<Rc<Table>>,
    /// The merged documents published whole (`None`: published in pieces, see
    /// [`snapshot::WHOLE_LIMIT`]), in [`response::merged_source`] order.
    docs: [Option<Rc<Vec<u8>>>; 3],
}

impl Shared {
    pub fn new(config: Config, seed: u32) -> Shared {
        let seed = host::now_ms() ^ (u64::from(seed) << 32) ^ 0x9E37_79B9_7F4A_7C15;
        Shared {
            stripped: config.client_identity.as_ref().map(|n| n.stripped_names()),
            config,
            cache: RefCell::new(Cache::default()),
            metrics: RefCell::new(Metrics::default()),
            rng: Cell::new(seed | 1),
        }
    }

    /// Counter `base` with `labels` incremented by one.
    pub fn inc(&self, base: &str, labels: &[(&str, &str)]) {
        self.metrics.borrow_mut().inc_labelled(base, labels);
    }

    /// Sends a reply the filter makes itself (counting its error about `gvr`, if it is one).
    pub fn send(&self, reply: &LocalReply, gvr: Option<&Gvr>) -> Action {
        if let (Some(error), Some(gvr)) = (reply.error, gvr) {
            self.inc(metrics::PROXY_ERRORS, &error.labels(gvr));
        }
        let headers: Vec<(&str, &str)> = reply.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if let Err(e) = hostcalls::send_http_response(reply.status, headers, Some(&reply.body)) {
            log::error!("kube-peer-proxy: cannot send local reply: {e:?}");
        }
        Action::Pause
    }

    /// The local server, as the table names it.
    pub fn local(&self) -> Target {
        Target {
            cluster: self.config.local_cluster.clone(),
            address: None,
        }
    }

    /// xorshift64*: uniform enough to spread requests over peers, no crate needed.
    pub fn pick(&self, n: usize) -> usize {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        usize::try_from(r % n.max(1) as u64).unwrap_or(0)
    }

    /// The table a request routes with: the newest published. A request reads only the CAS of
    /// [`snapshot::KEY_PUBLISHED`] (no value is copied), so a new snapshot, e.g. one that marks a
    /// member unreachable, is used from the next request on; the worker's timer usually has it
    /// decoded.
    pub fn table(&self) -> Option<Rc<Table>> {
        self.refresh()
    }

    /// The worker timer's work: the newest table, so requests rarely decode a head.
    pub fn on_tick(&self) {
        self.refresh();
    }

    /// Whether `table.servers[index]` is marked down now, by any worker (one shared-data read).
    pub fn is_down(&self, index: usize) -> bool {
        let cache = self.cache.borrow();
        passive_health::is_down(cache.table.as_deref(), index, &mut host::shared_u64)
    }

    /// Marks a server down for every worker (shared data): each reads it on its next reroute.
    pub fn mark_down(&self, target: &str) {
        let value = passive_health::mark_value(host::now_ms());
        host::set_shared(&passive_health::down_key(target), value.as_bytes());
    }

    fn refresh(&self) -> Option<Rc<Table>> {
        // Read before the generation: a snapshot published in between is seen by the next request.
        let published = host::shared_cas(snapshot::KEY_PUBLISHED);
        {
            let cache = self.cache.borrow();
            if published.is_some() && published == cache.published && cache.table.is_some() {
                return cache.table.clone();
            }
        }
        let generation = host::shared_u64(snapshot::KEY_GENERATION);
        let mut cache = self.cache.borrow_mut();
        if generation.is_none() {
            return cache.table.clone();
        }
        if generation == cache.generation {
            cache.published = published;
            return cache.table.clone();
        }
        let table = match host::shared(snapshot::KEY_TABLE).map(|b| Table::decode(&b)) {
            // Only the head: each lookup reads its entry from shared data, so this VM holds no
            // table and its memory does not grow with the table (one VM per Envoy worker).
            Some(Ok(t)) => Table {
                key_source: KeySource::Shared(host::shared),
                ..t
            },
            Some(Err(e)) => {
                log::error!("kube-peer-proxy: undecodable snapshot table: {e}");
                return cache.table.clone();
            }
            None => return cache.table.clone(),
        };
        // A whole document is copied into this VM; a chunked one is read piece by piece when a
        // request needs it. The documents must belong to this table; if the service is mid-write,
        // keep the previous snapshot and look again on the next request or tick.
        let doc = |doc: MergedDoc| -> Option<Option<Rc<Vec<u8>>>> {
            let (key, index) = response::merged_source(doc);
            let len = table.merged_lengths.get(index).copied().unwrap_or(0);
            if snapshot::is_chunked(len) {
                return Some(None);
            }
            let whole = host::shared(key).and_then(|v| snapshot::untag(table.generation, v))?;
            Some(Some(Rc::new(whole)))
        };
        if let (Some(apis), Some(api), Some(legacy)) =
            (doc(MergedDoc::Apis), doc(MergedDoc::Api), doc(MergedDoc::ApisLegacy))
        {
            cache.generation = Some(table.generation);
            cache.published = published;
            cache.table = Some(Rc::new(table));
            cache.docs = [apis, api, legacy];
        }
        cache.table.clone()
    }

    /// The body of a merged answer for `table` (the cached one): this VM's copy, or where its
    /// pieces are.
    pub fn merged(&self, doc: MergedDoc, table: &Table) -> Body {
        let (key, index) = response::merged_source(doc);
        let cache = self.cache.borrow();
        match cache.docs.get(index).cloned().flatten() {
            Some(whole) => Body::Whole(whole),
            None => Body::Pieces {
                key,
                generation: table.generation,
                len: table.merged_lengths.get(index).copied().unwrap_or(0),
            },
        }
    }
}

/// A merged answer's body: the VM's copy, or a document published in pieces, copied into the
/// response one piece at a time (see [`snapshot::WHOLE_LIMIT`]).
#[derive(Clone)]
pub enum Body {
    Whole(Rc<Vec<u8>>),
    Pieces {
        key: &'static str,
        generation: u64,
        len: u64,
    },
}

impl Body {
    /// Replaces the response body (`size` bytes of the local answer's last chunk) with this one.
    pub fn write(&self, size: usize) {
        let (key, generation, len) = match self {
            Body::Whole(doc) => {
                if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, size, doc) {
                    log::error!("kube-peer-proxy: cannot replace the discovery body: {e:?}");
                }
                return;
            }
            Body::Pieces { key, generation, len } => (*key, *generation, *len),
        };
        let mut written = 0usize;
        for i in 0..snapshot::chunk_count(len) {
            let piece =
                host::shared(&snapshot::chunk_key(key, generation, i)).and_then(|v| snapshot::untag(generation, v));
            let Some(piece) = piece else {
                // Only if two newer snapshots were published while this loop ran (each takes a
                // discovery round): the body stays short, and the client's JSON decoder says so.
                log::error!(
                    "kube-peer-proxy: piece {i} of {key} generation {generation} is gone; the answer is cut short"
                );
                return;
            };
            // The first piece replaces the local chunk; the next ones are appended.
            let (start, drop) = if i == 0 { (0, size) } else { (written, 0) };
            if let Err(e) = hostcalls::set_buffer(BufferType::HttpResponseBody, start, drop, &piece) {
                log::error!("kube-peer-proxy: cannot write the discovery body: {e:?}");
                return;
            }
            written += piece.len();
        }
    }
}
