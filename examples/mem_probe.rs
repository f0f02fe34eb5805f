//! Where the discovery service's memory goes: one discovery round through `Syncer` (as
//! `core_bench snapshot` does), the publish's allocations (entries, head, documents) as
//! `src/wasm/service.rs` makes them, with every heap allocation counted. Bodies are read in
//! pieces, as the service reads them from Envoy's buffer.
//!
//!     mem_probe <local.json> <peer.json>...
//!
//! Built for `wasm32-wasip1` and run by `bench/mem_probe.py` (wasmtime), it prints the bytes a
//! wasm32 discovery VM holds: pointers and `String`s have their wasm sizes there, and the linear
//! memory's size in pages is what Envoy's VM keeps resident (wasm memory never shrinks). Natively
//! it runs too (64-bit sizes, no pages).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::process::ExitCode;
use std::rc::Rc;

use kube_peer_proxy::config::Config;
use kube_peer_proxy::discovery::sync::{Body, Outcome, Publish, Syncer};
use kube_peer_proxy::snapshot;

struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

fn add(n: usize) {
    COUNT.with(|c| c.set(c.get() + 1));
    let live = LIVE.with(|l| {
        l.set(l.get() + n);
        l.get()
    });
    PEAK.with(|p| p.set(p.get().max(live)));
}

fn sub(n: usize) {
    LIVE.with(|l| l.set(l.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded to `System` unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size());
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        sub(layout.size());
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size);
        sub(layout.size());
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn live() -> usize {
    LIVE.with(Cell::get)
}

fn reset_peak() -> usize {
    PEAK.with(|p| {
        p.set(live());
        p.get()
    })
}

fn peak() -> usize {
    PEAK.with(Cell::get)
}

fn pages() -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::memory_size(0) * 65536
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        0
    }
}

const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

fn mib(n: usize) -> String {
    format!("{:.1}", n as f64 / 1048576.0)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mem_probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        return Err("usage: mem_probe <local.json> <peer.json>...".into());
    }
    let bodies: Vec<(Rc<Vec<u8>>, String)> = paths
        .iter()
        .map(|p| {
            let b = Rc::new(std::fs::read(p).map_err(|e| format!("{p}: {e}"))?);
            let t = snapshot::etag(&b);
            Ok((b, t))
        })
        .collect::<Result<_, String>>()?;
    let clusters: Vec<String> = (0..bodies.len())
        .map(|i| {
            if i == 0 {
                "local".to_string()
            } else {
                format!("peer-{i}")
            }
        })
        .collect();
    let peers: Vec<String> = (1..bodies.len())
        .map(|i| format!(r#"{{"name":"peer{i}","cluster":"peer-{i}"}}"#))
        .collect();
    let config = Config::parse(
        format!(
            r#"{{"local_name":"local","local_cluster":"local","peers":[{}]}}"#,
            peers.join(",")
        )
        .as_bytes(),
    )?;
    let base = live();
    let base_pages = pages();
    reset_peak();
    let mut syncer = Syncer::new(&config);
    let mut queue = syncer.on_tick(1_000).fetches;
    let mut published: Option<Publish> = None;
    let mut answered_peak = 0usize;
    while let Some(f) = queue.pop() {
        let server = clusters.iter().position(|c| *c == f.cluster);
        let outcome = match (f.path(), server.and_then(|i| bodies.get(i))) {
            // The service leaves the body in Envoy's buffer and reads it in pieces: the probe
            // leaves it in its own copy (counted in the baseline, not in the round).
            ("/apis", Some((body, etag))) => Outcome::Response {
                status: 200,
                content_type: V2.to_string(),
                etag: Some(etag.clone()),
                body: {
                    let body = Rc::clone(body);
                    Body::Pieces {
                        len: body.len(),
                        read: Rc::new(move |start, max| {
                            body.get(start..start.saturating_add(max).min(body.len()))
                                .map(<[u8]>::to_vec)
                        }),
                    }
                },
            },
            _ => Outcome::Response {
                status: 404,
                content_type: "application/json".to_string(),
                etag: None,
                body: Body::Bytes(Vec::new()),
            },
        };
        let allocs = COUNT.with(Cell::get);
        let step = syncer.on_response(f.id, outcome, 1_000);
        answered_peak = answered_peak.max(live());
        if std::env::var_os("MEM_PROBE_STEPS").is_some() {
            eprintln!(
                "step {} {}: live {} MiB, peak {} MiB, {} allocations, publish {}",
                f.cluster,
                f.path(),
                mib(live() - base),
                mib(peak() - base),
                COUNT.with(Cell::get) - allocs,
                step.publish.is_some()
            );
        }
        queue.extend(step.fetches);
        published = published.or(step.publish);
    }
    let round_peak = peak() - base;
    let mut p = published.ok_or("the round published no snapshot")?;
    let held_with_publish = live() - base;
    // The publish, as src/wasm/service.rs makes it: entries, documents, head.
    let entries: usize = p.table.entries().map(|(k, v)| k.len() + v.len()).sum();
    let keys = p.table.keys.len();
    let steps = std::env::var_os("MEM_PROBE_STEPS").is_some();
    if steps {
        eprintln!(
            "publish entries: live {} MiB, peak {} MiB",
            mib(live() - base),
            mib(peak() - base)
        );
    }
    p.table.keep_head_keys_only();
    let head = p.table.encode_head().len();
    let mut docs = 0usize;
    for doc in snapshot::MERGED_DOCS {
        let (key, index) = kube_peer_proxy::request::response::merged_source(doc);
        let len = p.table.merged_lengths.get(index).copied().unwrap_or(0);
        let put = snapshot::put_document(key, 1, len, &mut |sink| p.merged.write(doc, sink), &mut |_, v| {
            docs += v.len();
            true
        });
        if !put {
            return Err(format!("{key} was not written as measured"));
        }
        if steps {
            eprintln!(
                "publish {key}: live {} MiB, peak {} MiB",
                mib(live() - base),
                mib(peak() - base)
            );
        }
    }
    drop(p);
    let publish_peak = peak() - base;
    let retained = live() - base;
    println!(
        "{{\"round_peak_mib\":{},\"publish_peak_mib\":{},\"held_with_publish_mib\":{},\"retained_mib\":{},\
         \"linear_memory_mib\":{},\"linear_memory_growth_mib\":{},\"entries_bytes\":{entries},\"head_bytes\":{head},\
         \"documents_bytes\":{docs},\"keys\":{keys},\"input_bytes\":{}}}",
        mib(round_peak),
        mib(publish_peak),
        mib(held_with_publish),
        mib(retained),
        mib(pages()),
        mib(pages() - base_pages),
        bodies.iter().map(|(b, _)| b.len()).sum::<usize>(),
    );
    let _ = answered_peak;
    Ok(())
}
