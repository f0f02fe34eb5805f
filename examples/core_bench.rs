//! Workloads of the pure core for `bench/core_bench.sh`, which runs them under
//! `valgrind --tool=callgrind` and turns the instruction counts into per-operation costs.
//!
//!     core_bench list                      every workload: name, unit, suggested iterations
//!     core_bench run <workload> <n>        set up, then run the workload n times
//!     core_bench synth <base.json> <groups> <versions> <resources>
//!                                          base's items plus synthetic CRD groups, as v2 JSON
//!     core_bench snapshot <local.json> <peer.json>...
//!                                          one discovery round through `Syncer` (`/api` answers
//!                                          404), prints the sizes of the shared-data values
//!
//! `run` does the same set-up whatever `n` is, so the cost of one operation is
//! `(instructions(run w hi) - instructions(run w lo)) / (hi - lo)`: set-up and exit cancel out.
//! `run` prints `note: ...` lines describing the input (sizes, the decision taken).
//! Everything here is std plus the crate (no benchmark framework).

use std::hint::black_box;
use std::process::ExitCode;

use kube_peer_proxy::config::Config;
use kube_peer_proxy::discovery::documents::{
    self, GroupDiscovery, GroupMeta, Gvk, ResourceDiscovery, Str, SubresourceDiscovery, VersionDiscovery,
};
use kube_peer_proxy::discovery::merge;
use kube_peer_proxy::discovery::sync::{Body, Outcome, Publish, Syncer};
use kube_peer_proxy::request::request_info;
use kube_peer_proxy::request::routing::{self, RequestFacts};
use kube_peer_proxy::snapshot::{self, ServerDiscovery, ServerRef, Table};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/k8s-discovery/");
const OLD: &str = "aggregated_v2.k8s-1.33.json";
const NEW: &str = "aggregated_v2.k8s-1.37-dev-fork.json";
const LEGACY_CORE: &str = "legacy_api__v1.k8s-pre-1.33.json";

const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const KUBECTL_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// The large table of the Envoy benchmark: 400 CRD groups x 2 versions x 25 resources = 20 000
/// resources (each with a `status` subresource), served by every server.
const BIG_GROUPS: usize = 400;
const BIG_VERSIONS: usize = 2;
const BIG_RESOURCES: usize = 25;

/// A request of the decision mix: (name, method, path, accept, x-kubernetes-peer-proxied).
type Req = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
);

/// Requests a server sees, one of each decision outcome (old server a, new peers b and c).
const REQUESTS: &[Req] = &[
    (
        "local-get",
        "GET",
        "/apis/apps/v1/namespaces/default/deployments/web",
        None,
        None,
    ),
    (
        "local-list",
        "GET",
        "/api/v1/namespaces/kube-system/pods?labelSelector=app%3Dweb&limit=500",
        None,
        None,
    ),
    (
        "local-subresource",
        "PUT",
        "/api/v1/namespaces/default/pods/web-1/status",
        None,
        None,
    ),
    (
        "peer-get",
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/claim-1",
        None,
        None,
    ),
    (
        "peer-watch",
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?watch=true&resourceVersion=1234",
        None,
        None,
    ),
    ("peer-gv-discovery", "GET", "/apis/resource.k8s.io/v1", None, None),
    ("merged-apis", "GET", "/apis", Some(KUBECTL_ACCEPT), None),
    ("non-resource", "GET", "/healthz", None, None),
    (
        "already-proxied",
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/claim-1",
        None,
        Some("true"),
    ),
    (
        "nobody-serves",
        "GET",
        "/apis/nope.example.com/v1/namespaces/default/widgets/w",
        None,
        None,
    ),
];

struct Workload {
    name: &'static str,
    unit: &'static str,
    /// The script runs the workload `lo` and `hi` times; one operation costs
    /// `(instructions(hi) - instructions(lo)) / (hi - lo)`.
    lo: u64,
    hi: u64,
}

fn cheap(name: &'static str, unit: &'static str, n: u64) -> Workload {
    Workload {
        name,
        unit,
        lo: n,
        hi: 2 * n,
    }
}

/// Set-up alone costs seconds under callgrind: measure 0 against `n` iterations.
fn costly(name: &'static str, unit: &'static str, n: u64) -> Workload {
    Workload {
        name,
        unit,
        lo: 0,
        hi: n,
    }
}

fn workloads() -> Vec<Workload> {
    let mut w = Vec::new();
    for (name, ..) in REQUESTS {
        w.push(cheap(leak(format!("decide/{name}")), "call", 2_000));
    }
    w.push(costly("decide-big/local-get", "call", 2_000));
    w.push(costly("decide-big/peer-get", "call", 2_000));
    for (name, ..) in REQUESTS {
        w.push(cheap(leak(format!("parse/{name}")), "call", 2_000));
    }
    w.extend([
        cheap("accept/kubectl", "call", 2_000),
        cheap("parse_aggregated/1.33", "document", 10),
        cheap("parse_aggregated/1.37", "document", 10),
        cheap("merge_groups/3-servers", "merge", 10),
        cheap("to_v2_json/merged", "document", 10),
        cheap("table/build", "table", 10),
        cheap("table/encode", "table", 10),
        cheap("table/decode", "table", 10),
        cheap("etag/merged-apis", "document", 10),
        cheap("sync-round/200", "round", 4),
        cheap("sync-round/304", "round", 4),
        costly("table-big/decode", "table", 2),
        costly("sync-round-big/304", "round", 1),
    ]);
    w
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match argv.as_slice() {
        ["list"] => {
            for w in workloads() {
                println!("{}\t{}\t{}\t{}", w.name, w.unit, w.lo, w.hi);
            }
            Ok(())
        }
        ["run", name, n] => n
            .parse::<u64>()
            .map_err(|e| format!("iterations {n:?}: {e}"))
            .and_then(|n| run(name, n)),
        ["synth", base, groups, versions, resources] => synth_cmd(base, groups, versions, resources),
        ["snapshot", local, peers @ ..] if !peers.is_empty() => snapshot_cmd(local, peers),
        _ => Err(
            "usage: core_bench list | run <workload> <n> | synth <base.json> <groups> <versions> \
                  <resources> | snapshot <local.json> <peer.json>..."
                .to_string(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("core_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn read(path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))
}

fn fixture(name: &str) -> Result<Vec<u8>, String> {
    read(&format!("{FIXTURES}{name}"))
}

fn groups_of(body: &[u8]) -> Result<Vec<GroupDiscovery>, String> {
    documents::parse_aggregated(body)
        .map(|l| l.items)
        .map_err(|e| e.to_string())
}

/// The core group as an aggregated `/api` would list it (from the legacy `/api/v1` fixture).
fn core_groups() -> Result<Vec<GroupDiscovery>, String> {
    let list = documents::parse_resource_list(&fixture(LEGACY_CORE)?).map_err(|e| e.to_string())?;
    Ok(vec![GroupDiscovery {
        metadata: GroupMeta::default(),
        versions: vec![documents::version_from_legacy("v1", &list)].into(),
    }])
}

/// Synthetic CRD groups: `g<i>.bench.example.com`, versions `v1`, `v1beta1`, ..., resources
/// `kind<j>s` with a `status` subresource, like a cluster with many operators installed.
fn synth_groups(groups: usize, versions: usize, resources: usize) -> Vec<GroupDiscovery> {
    let verbs: Vec<Str> = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ]
    .iter()
    .map(|s| Str::from(*s))
    .collect();
    let version_names = ["v1", "v1beta1", "v1alpha1", "v1beta2", "v2"];
    (0..groups)
        .map(|g| {
            let group = format!("g{g:04}.bench.example.com");
            GroupDiscovery {
                metadata: GroupMeta {
                    name: group.clone().into(),
                },
                versions: (0..versions)
                    .map(|v| {
                        let version = version_names
                            .get(v)
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| format!("v{v}"));
                        VersionDiscovery {
                            version: version.clone().into(),
                            resources: (0..resources)
                                .map(|r| {
                                    let kind = format!("Kind{r:02}");
                                    let gvk = Gvk {
                                        group: group.clone().into(),
                                        version: version.clone().into(),
                                        kind: kind.clone().into(),
                                    };
                                    ResourceDiscovery {
                                        resource: format!("kind{r:02}s").into(),
                                        response_kind: Some(gvk.clone()),
                                        scope: "Namespaced".into(),
                                        singular_resource: format!("kind{r:02}").into(),
                                        verbs: verbs.clone().into(),
                                        short_names: Vec::new().into(),
                                        categories: vec!["all".into()].into(),
                                        subresources: vec![SubresourceDiscovery {
                                            subresource: "status".into(),
                                            response_kind: Some(gvk),
                                            accepted_types: Vec::new(),
                                            verbs: vec![
                                                "get".into(),
                                                "patch".to_string().into(),
                                                "update".to_string().into(),
                                            ]
                                            .into(),
                                        }],
                                    }
                                })
                                .collect(),
                            freshness: "Current".into(),
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

fn synth_cmd(base: &str, groups: &str, versions: &str, resources: &str) -> Result<(), String> {
    let num = |s: &str| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
    let mut items = groups_of(&read(base)?)?;
    items.extend(synth_groups(num(groups)?, num(versions)?, num(resources)?));
    let body = documents::to_v2_json(&items);
    use std::io::Write;
    std::io::stdout().write_all(&body).map_err(|e| format!("writing: {e}"))
}

/// Answers every fetch of a [`Syncer`] round: `/apis` from `docs[server]` (ETag honoured, so a
/// repeated round is all 304s, like a real apiserver), `/api` with 404.
struct Servers {
    clusters: Vec<String>,
    docs: Vec<(Vec<u8>, String)>,
    cores: Option<(Vec<u8>, String)>,
}

impl Servers {
    fn new(apis: Vec<Vec<u8>>, core: Option<Vec<u8>>) -> Servers {
        let tag = |b: &[u8]| snapshot::etag(b);
        let mut clusters = vec!["local".to_string()];
        clusters.extend((1..apis.len()).map(|i| format!("peer-{i}")));
        Servers {
            clusters,
            docs: apis
                .into_iter()
                .map(|b| {
                    let t = tag(&b);
                    (b, t)
                })
                .collect(),
            cores: core.map(|b| {
                let t = tag(&b);
                (b, t)
            }),
        }
    }

    fn config(&self) -> Result<Config, String> {
        let peers: Vec<String> = (1..self.docs.len())
            .map(|i| format!(r#"{{"name":"peer{i}","cluster":"peer-{i}"}}"#))
            .collect();
        let json = format!(
            r#"{{"local_name":"local","local_cluster":"local","peers":[{}]}}"#,
            peers.join(",")
        );
        Config::parse(json.as_bytes())
    }

    /// One full round; returns the snapshot if it changed.
    fn round(&self, syncer: &mut Syncer, now_ms: u64) -> Option<Publish> {
        let mut queue = syncer.on_tick(now_ms).fetches;
        let mut published = None;
        while let Some(f) = queue.pop() {
            let server = self.clusters.iter().position(|c| *c == f.cluster);
            let doc = match (f.path(), server) {
                ("/apis", Some(i)) => self.docs.get(i),
                ("/api", Some(_)) => self.cores.as_ref(),
                _ => None,
            };
            let if_none_match = f
                .headers
                .iter()
                .find(|(k, _)| k == "if-none-match")
                .map(|(_, v)| v.as_str());
            let outcome = match doc {
                Some((_, etag)) if if_none_match == Some(etag.as_str()) => Outcome::Response {
                    status: 304,
                    content_type: String::new(),
                    etag: Some(etag.clone()),
                    body: Body::Bytes(Vec::new()),
                },
                Some((body, etag)) => Outcome::Response {
                    status: 200,
                    content_type: V2.to_string(),
                    etag: Some(etag.clone()),
                    body: Body::Bytes(body.clone()),
                },
                None => Outcome::Response {
                    status: 404,
                    content_type: "application/json".to_string(),
                    etag: None,
                    body: Body::Bytes(Vec::new()),
                },
            };
            let step = syncer.on_response(f.id, outcome, now_ms);
            queue.extend(step.fetches);
            published = published.or(step.publish);
        }
        published
    }
}

fn snapshot_cmd(local: &str, peers: &[&str]) -> Result<(), String> {
    let mut apis = vec![read(local)?];
    for p in peers {
        apis.push(read(p)?);
    }
    let servers = Servers::new(apis, None);
    let mut syncer = Syncer::new(&servers.config()?);
    let p = servers
        .round(&mut syncer, 1_000)
        .ok_or("the round published no snapshot")?;
    // The values the discovery service writes to shared data (src/wasm/service.rs `publish`).
    let values = [
        ("table", p.table.encode().len()),
        ("merged_apis", p.merged_apis().len()),
        ("merged_api", p.merged_api().len()),
        ("merged_apis_legacy", p.merged_apis_legacy().len()),
        ("generation", p.table.generation.to_string().len()),
    ];
    let total: usize = values.iter().map(|(_, n)| n).sum();
    let fields: Vec<String> = values.iter().map(|(k, n)| format!("\"{k}_bytes\":{n}")).collect();
    println!(
        "{{{},\"total_bytes\":{total},\"keys\":{},\"servers\":{}}}",
        fields.join(","),
        p.table.keys.len(),
        p.table.servers.len()
    );
    Ok(())
}

fn server(name: &str, local: bool) -> ServerRef {
    ServerRef {
        name: name.to_string(),
        cluster: if local {
            "local".to_string()
        } else {
            format!("peer-{name}")
        },
        local,
        address: None,
    }
}

/// Old local server a (1.33 API set) and new peers b, c (1.37-dev set), all with the core group;
/// `big` adds the synthetic 20 000 CRD resources to every server.
fn discoveries(big: bool) -> Result<Vec<ServerDiscovery>, String> {
    let core = core_groups()?;
    let mut old = groups_of(&fixture(OLD)?)?;
    let mut new = groups_of(&fixture(NEW)?)?;
    if big {
        let crds = synth_groups(BIG_GROUPS, BIG_VERSIONS, BIG_RESOURCES);
        old.extend(crds.iter().cloned());
        new.extend(crds);
    }
    Ok(vec![
        ServerDiscovery {
            core: core.clone(),
            groups: old,
        },
        ServerDiscovery {
            core: core.clone(),
            groups: new.clone(),
        },
        ServerDiscovery { core, groups: new },
    ])
}

fn build_table(discs: &[ServerDiscovery]) -> Table {
    let refs = [server("a", true), server("b", false), server("c", false)];
    let pairs: Vec<(ServerRef, &ServerDiscovery)> = refs.into_iter().zip(discs.iter()).collect();
    Table::build(&pairs)
}

/// The table as a filter VM holds it: decoded from the published bytes, with everything used to
/// build it already freed (so the allocator state resembles the filter's, not the builder's).
fn routing_table(big: bool) -> Result<Table, String> {
    let bytes = build_table(&discoveries(big)?).encode();
    Table::decode(&bytes)
}

fn request(name: &str) -> Result<&'static Req, String> {
    REQUESTS
        .iter()
        .find(|r| r.0 == name)
        .ok_or_else(|| format!("unknown request {name:?}"))
}

fn facts(r: &'static Req) -> RequestFacts<'static> {
    RequestFacts {
        method: r.1,
        path: r.2,
        accept: r.3,
        peer_proxied: r.4,
    }
}

fn decide_loop(table: &Table, r: &'static Req, n: u64) -> Result<(), String> {
    let facts = facts(r);
    let decision = routing::decide(&facts, Some(table), true, &mut |_| 0);
    println!("note: {} {} -> {}", r.1, r.2, outcome(&decision));
    for _ in 0..n {
        black_box(routing::decide(
            black_box(&facts),
            Some(black_box(table)),
            true,
            &mut |_| 0,
        ));
    }
    Ok(())
}

fn outcome(d: &routing::Decision) -> String {
    match d {
        routing::Decision::Peer { index, .. } => format!("Peer (server {index})"),
        other => format!("{other:?}"),
    }
}

/// Repeats `f` n times; the result goes through `black_box` so the work is not optimised away.
fn repeat<T>(n: u64, mut f: impl FnMut() -> T) {
    for _ in 0..n {
        black_box(f());
    }
}

fn resources(groups: &[GroupDiscovery]) -> usize {
    groups
        .iter()
        .flat_map(|g| g.versions.iter())
        .map(|v| v.resources.len())
        .sum()
}

fn run(name: &str, n: u64) -> Result<(), String> {
    if !workloads().iter().any(|w| w.name == name) {
        return Err(format!("unknown workload {name:?} (see `core_bench list`)"));
    }
    if let Some(req) = name.strip_prefix("decide/") {
        let table = routing_table(false)?;
        return decide_loop(&table, request(req)?, n);
    }
    if let Some(req) = name.strip_prefix("decide-big/") {
        let table = routing_table(true)?;
        println!("note: table of {} keys", table.keys.len());
        return decide_loop(&table, request(req)?, n);
    }
    if let Some(req) = name.strip_prefix("parse/") {
        let r = request(req)?;
        let kind = match request_info::parse(r.1, r.2) {
            request_info::RequestKind::Resource(rr) => format!("resource, verb {}", rr.verb),
            other => format!("{other:?}"),
        };
        println!("note: {} {} -> {kind}", r.1, r.2);
        repeat(n, || request_info::parse(black_box(r.1), black_box(r.2)));
        return Ok(());
    }
    match name {
        "accept/kubectl" => {
            println!("note: kubectl's discovery Accept (3 clauses)");
            repeat(n, || {
                kube_peer_proxy::request::accept::negotiate(black_box(Some(KUBECTL_ACCEPT)))
            });
        }
        "parse_aggregated/1.33" | "parse_aggregated/1.37" => {
            let body = fixture(if name.ends_with("1.33") { OLD } else { NEW })?;
            let groups = groups_of(&body)?;
            println!(
                "note: fixture of {} bytes, {} groups, {} resources",
                body.len(),
                groups.len(),
                resources(&groups)
            );
            repeat(n, || documents::parse_aggregated(black_box(&body)));
        }
        "merge_groups/3-servers" | "to_v2_json/merged" | "etag/merged-apis" => {
            let discs = discoveries(false)?;
            let lists: Vec<&[GroupDiscovery]> = discs.iter().map(|d| d.groups.as_slice()).collect();
            let merged = merge::merge_groups(&lists);
            let body = documents::to_v2_json(&merged);
            match name {
                "merge_groups/3-servers" => {
                    println!(
                        "note: /apis of 1.33 + 1.37 + 1.37 -> {} groups, {} resources",
                        merged.len(),
                        resources(&merged)
                    );
                    repeat(n, || merge::merge_groups(black_box(&lists)));
                }
                "to_v2_json/merged" => {
                    println!("note: merged /apis, {} bytes", body.len());
                    repeat(n, || documents::to_v2_json(black_box(&merged)));
                }
                _ => {
                    println!("note: FNV-1a 128 over {} bytes", body.len());
                    repeat(n, || snapshot::etag(black_box(&body)));
                }
            }
        }
        "table/build" => {
            let discs = discoveries(false)?;
            println!("note: 3 servers -> {} keys", build_table(&discs).keys.len());
            repeat(n, || build_table(black_box(&discs)));
        }
        "table/encode" | "table/decode" | "table-big/decode" => {
            let table = build_table(&discoveries(name.starts_with("table-big"))?);
            let bytes = table.encode();
            println!("note: {} keys, {} bytes encoded", table.keys.len(), bytes.len());
            if name == "table/encode" {
                repeat(n, || black_box(&table).encode());
            } else {
                repeat(n, || Table::decode(black_box(&bytes)));
            }
        }
        "sync-round/200" | "sync-round/304" | "sync-round-big/304" => {
            let (old, new) = if name.starts_with("sync-round-big") {
                let crds = synth_groups(BIG_GROUPS, BIG_VERSIONS, BIG_RESOURCES);
                let mut old = groups_of(&fixture(OLD)?)?;
                old.extend(crds.iter().cloned());
                let mut new = groups_of(&fixture(NEW)?)?;
                new.extend(crds);
                (documents::to_v2_json(&old), documents::to_v2_json(&new))
            } else {
                (fixture(OLD)?, fixture(NEW)?)
            };
            let core = documents::to_v2_json(&core_groups()?);
            println!(
                "note: /apis of {} + 2 x {} bytes, /api of 3 x {} bytes",
                old.len(),
                new.len(),
                core.len()
            );
            let servers = Servers::new(vec![old, new.clone(), new], Some(core));
            let config = servers.config()?;
            if name.ends_with("200") {
                // A fresh syncer per round: every document is fetched (200), parsed and published.
                let mut now = 1_000;
                repeat(n, || {
                    let mut syncer = Syncer::new(&config);
                    now += 1;
                    servers.round(&mut syncer, now)
                });
            } else {
                // A round where nothing changed: every fetch is a 304, the cached documents are
                // merged and the table rebuilt and compared with the published one.
                let mut syncer = Syncer::new(&config);
                let refresh = u64::try_from(config.refresh_interval.as_millis()).unwrap_or(u64::MAX);
                let mut now = 1_000;
                servers
                    .round(&mut syncer, now)
                    .ok_or("the first round published no snapshot")?;
                repeat(n, || {
                    now += refresh;
                    servers.round(&mut syncer, now)
                });
            }
        }
        other => return Err(format!("workload {other:?} has no runner")),
    }
    Ok(())
}
