//! The singleton discovery service: runs [`Syncer`] on the main thread's timer, dispatches its
//! fetches, and publishes snapshots to shared data (table entries, documents and the table's head
//! first, generation last, so a filter that sees a new generation finds the matching head).

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};

use super::host::{self, Metrics};
use crate::config::Config;
use crate::discovery::sync::{answers, Body, Outcome, Publish, Step, Syncer};
use crate::metrics;
use crate::passive_health;
use crate::snapshot;

pub struct Service {
    syncer: Syncer,
    tokens: HashMap<u32, u64>,
    metrics: Metrics,
    /// Members whose `server_fresh` gauge was last set: one that left (its lease gone) is set to 0,
    /// since an Envoy gauge cannot be removed and would otherwise keep saying fresh.
    fresh_exported: Vec<String>,
}

impl Service {
    pub fn new(config: Config) -> Service {
        Service {
            syncer: Syncer::new(&config),
            tokens: HashMap::new(),
            metrics: Metrics::default(),
            fresh_exported: Vec::new(),
        }
    }

    pub fn on_tick(&mut self) {
        let now = host::now_ms();
        let step = self.syncer.on_tick(now);
        self.handle(step, now);
        self.export_gauges(now);
        self.clear_recovered_down_marks();
    }

    /// A peer that answered discovery after a filter marked it down is reachable again.
    fn clear_recovered_down_marks(&self) {
        for (target, key) in passive_health::recovered(self.syncer.answering_clusters(), &mut host::shared_u64) {
            log::info!("kube-peer-proxy: {target} answers again; routing to it resumes");
            host::set_shared(&key, passive_health::CLEARED);
        }
    }

    pub fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize) {
        let Some(id) = self.tokens.remove(&token) else { return };
        let outcome = if num_headers == 0 {
            Outcome::NoResponse
        } else if body_size > self.syncer.max_bytes() {
            Outcome::Oversized
        } else {
            let headers = host::headers(MapType::HttpCallResponseHeaders);
            let get = |n: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(n))
                    .map(|(_, v)| v.clone())
            };
            let status = get(":status").and_then(|s| s.parse().ok()).unwrap_or(0);
            // Left in Envoy's buffer (valid for this callback, in which the syncer parses it).
            let body = if status == 200 {
                Body::Pieces {
                    len: body_size,
                    read: Rc::new(|start, max| {
                        hostcalls::get_buffer(BufferType::HttpCallResponseBody, start, max)
                            .ok()
                            .flatten()
                    }),
                }
            } else {
                Body::Empty
            };
            answers::call_outcome(
                status,
                get("x-envoy-upstream-service-time").is_some(),
                get("content-type").unwrap_or_default(),
                get("etag"),
                body,
            )
        };
        let now = host::now_ms();
        let step = self.syncer.on_response(id, outcome, now);
        // Before a snapshot that shows the member healthy is published, so a worker that loads it
        // reads the cleared mark with it.
        self.clear_recovered_down_marks();
        self.handle(step, now);
        // A round may just have ended: the gauges should not wait for the next tick.
        self.export_gauges(now);
    }

    fn handle(&mut self, step: Step, now: u64) {
        let mut pending = vec![step];
        while let Some(step) = pending.pop() {
            for e in &step.errors {
                log::warn!(
                    "kube-peer-proxy: discovery from {} failed ({}): {}",
                    e.server,
                    e.kind.label(),
                    e.detail
                );
                self.metrics.inc(metrics::name(
                    metrics::SYNC_ERRORS,
                    &[("type", e.kind.label()), ("server", &e.server)],
                ));
            }
            if let Some(p) = step.publish {
                self.publish(p);
            }
            for f in step.fetches.into_iter().chain(step.probe) {
                let headers: Vec<(&str, &str)> = f.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let timeout = Duration::from_millis(f.timeout_ms);
                match hostcalls::dispatch_http_call(&f.cluster, headers, None, vec![], timeout) {
                    Ok(token) => {
                        self.tokens.insert(token, f.id);
                    }
                    Err(e) => {
                        log::warn!(
                            "kube-peer-proxy: cannot dispatch {} to cluster {}: {e:?}",
                            f.path(),
                            f.cluster
                        );
                        pending.push(self.syncer.on_response(f.id, Outcome::NoResponse, now));
                    }
                }
            }
        }
    }

    fn publish(&mut self, mut p: Publish) {
        let generation = p.table.generation;
        // Entries (only for a new key set) and documents first, then the head, the generation, and
        // last the key whose CAS every request reads (see `snapshot::KEY_PUBLISHED`).
        // A document is written into shared data as it is serialized (see `snapshot::put_document`).
        let entries = !p.keys_changed || p.table.entries().all(|(key, value)| host::set_shared(&key, &value));
        let keys = p.table.keys.len();
        p.table.keep_head_keys_only();
        let ok = entries
            && snapshot::MERGED_DOCS.iter().all(|doc| {
                let (key, index) = crate::request::response::merged_source(*doc);
                let len = p.table.merged_lengths.get(index).copied().unwrap_or(0);
                snapshot::put_document(
                    key,
                    generation,
                    len,
                    &mut |sink| p.merged.write(*doc, sink),
                    &mut |k, v| host::set_shared(k, v),
                )
            })
            && host::set_shared(snapshot::KEY_TABLE, &p.table.encode_head())
            && host::set_shared(snapshot::KEY_GENERATION, p.table.generation.to_string().as_bytes())
            && host::set_shared(snapshot::KEY_PUBLISHED, b"");
        if ok {
            let names: Vec<&str> = p.table.servers.iter().map(|s| s.name.as_str()).collect();
            log::info!(
                "kube-peer-proxy: published snapshot generation {} ({} keys; members: {})",
                p.table.generation,
                keys,
                names.join(", ")
            );
            self.metrics
                .set(metrics::SNAPSHOT_GENERATION.to_string(), p.table.generation);
        }
    }

    fn export_gauges(&mut self, now: u64) {
        if let Some(t) = self.syncer.round_completed_ms() {
            self.metrics
                .set(metrics::SNAPSHOT_AGE.to_string(), now.saturating_sub(t) / 1000);
        }
        let fresh: Vec<(String, bool)> = self
            .syncer
            .server_freshness(now)
            .map(|(n, f)| (n.to_string(), f))
            .collect();
        for gone in self
            .fresh_exported
            .iter()
            .filter(|n| !fresh.iter().any(|(f, _)| f == *n))
        {
            self.metrics
                .set(metrics::name(metrics::SERVER_FRESH, &[("server", gone)]), 0);
        }
        for (name, fresh) in &fresh {
            self.metrics.set(
                metrics::name(metrics::SERVER_FRESH, &[("server", name)]),
                u64::from(*fresh),
            );
        }
        self.fresh_exported = fresh.into_iter().map(|(n, _)| n).collect();
        let status: Vec<(String, Option<u64>)> = self.syncer.server_status().map(|(n, t)| (n.to_string(), t)).collect();
        for (name, last) in status {
            if let Some(t) = last {
                let age = now.saturating_sub(t) / 1000;
                self.metrics.set(
                    metrics::name(metrics::SERVER_LAST_SUCCESS_AGE, &[("server", &name)]),
                    age,
                );
            }
        }
    }
}
