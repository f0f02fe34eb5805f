//! The discovery synchroniser, driven with fake apiserver answers.
#![cfg(test)]

mod common;

use std::collections::{BTreeSet, HashMap, VecDeque};

use common::{fixture, group, json_gvrs, res, ver, AGG_133, AGG_137};
use kube_peer_proxy::config::Config;
use kube_peer_proxy::discovery::documents::{
    parse_aggregated, to_v2_json, unsupported_aggregated_version, CONTENT_TYPE_V2,
};
use kube_peer_proxy::discovery::sync::{Body, Fetch, Outcome, Publish, SyncError, Syncer, DISCOVERY_ACCEPT};
use kube_peer_proxy::request::routing::{decide, Decision, Gvr, LocalReason, RequestFacts};
use kube_peer_proxy::snapshot::{etag, resource_key, Table};
use kube_peer_proxy::PEER_PROXIED_HEADER;

const CONFIG: &str = r#"{
    "local_name": "local",
    "local_cluster": "local",
    "peers": [{"name": "peer-b", "cluster": "peer-b"}, {"name": "peer-c", "cluster": "peer-c"}],
    "refresh_interval": "1s",
    "fetch_timeout": "1s",
    "staleness_limit": "3s",
    "discovery_authority": "kube.example",
    "discovery_headers": {"authorization": "Bearer t0ken"},
    "max_discovery_bytes": 200000
}"#;

const LEGACY_CT: &str = "application/json";
const LEASE_ADDRESS_HEADER: &str = "x-kube-peer-proxy-peer-address";

fn config() -> Config {
    Config::parse(CONFIG.as_bytes()).expect("config")
}

fn header<'a>(f: &'a Fetch, name: &str) -> Option<&'a str> {
    f.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// One document a fake server serves.
#[derive(Clone)]
struct Doc {
    content_type: String,
    body: Vec<u8>,
    etag: Option<String>,
}

/// Fake apiservers keyed by cluster. Documents answer 200 (or 304 when `if-none-match` matches);
/// overrides replace the answer (`None` = never answer); anything else is a 404.
#[derive(Clone, Default)]
struct Fake {
    docs: HashMap<(String, String), Doc>,
    overrides: HashMap<(String, String), Option<Outcome>>,
    fallback: Option<fn(&str, &str) -> Option<Outcome>>,
    not_modified: std::cell::Cell<usize>,
    /// Serve 200 bodies as the discovery service does: left outside, read in pieces (of this size).
    pieces: Option<usize>,
}

/// `body` as a [`Body::Pieces`] whose reads give at most `piece` bytes (fewer than asked for, so
/// the reader's loop is exercised), and fail from `fail_at` on.
fn pieces(body: Vec<u8>, piece: usize, fail_at: Option<usize>) -> Body {
    let body = std::rc::Rc::new(body);
    Body::Pieces {
        len: body.len(),
        read: std::rc::Rc::new(move |start, max| {
            if fail_at.is_some_and(|f| start >= f) {
                return None;
            }
            let end = (start + max.min(piece)).min(body.len());
            body.get(start..end).map(<[u8]>::to_vec)
        }),
    }
}

impl Fake {
    fn doc(&mut self, cluster: &str, path: &str, content_type: &str, body: Vec<u8>, with_etag: bool) {
        let etag = with_etag.then(|| etag(&body));
        self.docs.insert(
            (cluster.into(), path.into()),
            Doc {
                content_type: content_type.into(),
                body,
                etag,
            },
        );
    }

    fn aggregated(&mut self, cluster: &str, path: &str, body: Vec<u8>) {
        self.doc(cluster, path, CONTENT_TYPE_V2, body, true);
    }

    fn set(&mut self, cluster: &str, path: &str, outcome: Option<Outcome>) {
        self.overrides.insert((cluster.into(), path.into()), outcome);
    }

    fn serve(&self, f: &Fetch) -> Option<Outcome> {
        // Lease peers share one address-picked cluster: the fake keys them by address.
        let target = header(f, LEASE_ADDRESS_HEADER).unwrap_or(&f.cluster).to_string();
        let key = (target, f.path().to_string());
        if let Some(o) = self.overrides.get(&key) {
            return o.clone();
        }
        if let Some(d) = self.docs.get(&key) {
            if d.etag.is_some() && header(f, "if-none-match") == d.etag.as_deref() {
                self.not_modified.set(self.not_modified.get() + 1);
                return Some(Outcome::Response {
                    status: 304,
                    content_type: String::new(),
                    etag: d.etag.clone(),
                    body: Body::Bytes(Vec::new()),
                });
            }
            return Some(Outcome::Response {
                status: 200,
                content_type: d.content_type.clone(),
                etag: d.etag.clone(),
                body: match self.pieces {
                    Some(n) => pieces(d.body.clone(), n, None),
                    None => Body::Bytes(d.body.clone()),
                },
            });
        }
        if let Some(fb) = self.fallback {
            if let Some(o) = fb(&f.cluster, f.path()) {
                return Some(o);
            }
        }
        // Every kube-apiserver serves its readiness (unless a test overrides it).
        if f.path() == "/readyz" {
            return Some(Outcome::Response {
                status: 200,
                content_type: "text/plain; charset=utf-8".into(),
                etag: None,
                body: Body::Bytes(b"ok".to_vec()),
            });
        }
        Some(Outcome::Response {
            status: 404,
            content_type: "text/plain; charset=utf-8".into(),
            etag: None,
            body: Body::Bytes(b"404 page not found\n".to_vec()),
        })
    }
}

fn core_doc(subs: &[&str]) -> Vec<u8> {
    to_v2_json(&[group(
        "",
        vec![ver("v1", vec![res("pods", subs), res("configmaps", &[])])],
    )])
}

const LEGACY_GROUPS: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[
  {"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}},
  {"name":"widgets.example.com","versions":[{"groupVersion":"widgets.example.com/v1","version":"v1"},{"groupVersion":"widgets.example.com/v1beta1","version":"v1beta1"}],
   "preferredVersion":{"groupVersion":"widgets.example.com/v1","version":"v1"}}]}"#;

const WIDGETS_V1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"widgets.example.com/v1","resources":[
  {"name":"widgets","singularName":"widget","namespaced":true,"kind":"Widget","verbs":["get","list","watch"]},
  {"name":"widgets/status","singularName":"","namespaced":true,"kind":"Widget","verbs":["get","patch"]}]}"#;

const WIDGETS_V1BETA1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"widgets.example.com/v1beta1","resources":[
  {"name":"gadgets","singularName":"gadget","namespaced":false,"kind":"Gadget","verbs":["get"]}]}"#;

/// peer-c's OpenAPI v3 index (`/openapi/v3`): the group versions of its walk, and other paths.
const PEER_C_INDEX: &str = r#"{"paths":{
  ".well-known/openid-configuration":{"serverRelativeURL":"/openapi/v3/.well-known/openid-configuration?hash=1"},
  "api":{"serverRelativeURL":"/openapi/v3/api?hash=2"},
  "api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=3"},
  "apis":{"serverRelativeURL":"/openapi/v3/apis?hash=4"},
  "apis/apps/v1":{"serverRelativeURL":"/openapi/v3/apis/apps/v1?hash=5"},
  "apis/widgets.example.com/v1":{"serverRelativeURL":"/openapi/v3/apis/widgets.example.com/v1?hash=6"},
  "apis/widgets.example.com/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/widgets.example.com/v1beta1?hash=7"},
  "version":{"serverRelativeURL":"/openapi/v3/version?hash=8"}}}"#;

/// local: 1.33 `/apis` + core without `pods/resize`; peer-b: 1.37-dev `/apis` + core with
/// `pods/resize`; peer-c: a legacy-only server (APIVersions / APIGroupList).
fn fake() -> Fake {
    let mut f = Fake::default();
    f.aggregated("local", "/api", core_doc(&["status", "exec"]));
    f.aggregated("local", "/apis", fixture(AGG_133));
    f.aggregated("peer-b", "/api", core_doc(&["status", "exec", "resize"]));
    f.aggregated("peer-b", "/apis", fixture(AGG_137));
    f.doc("peer-c", "/api", LEGACY_CT, fixture("legacy_api.json"), true);
    f.doc(
        "peer-c",
        "/api/v1",
        LEGACY_CT,
        fixture("legacy_api__v1.k8s-pre-1.33.json"),
        true,
    );
    f.doc("peer-c", "/apis", LEGACY_CT, LEGACY_GROUPS.as_bytes().to_vec(), true);
    f.doc(
        "peer-c",
        "/openapi/v3",
        LEGACY_CT,
        PEER_C_INDEX.as_bytes().to_vec(),
        true,
    );
    // Legacy discovery from real servers often has no ETag.
    f.doc(
        "peer-c",
        "/apis/apps/v1",
        LEGACY_CT,
        fixture("legacy_apis__apps__v1.json"),
        false,
    );
    f.doc(
        "peer-c",
        "/apis/widgets.example.com/v1",
        LEGACY_CT,
        WIDGETS_V1.as_bytes().to_vec(),
        true,
    );
    f.doc(
        "peer-c",
        "/apis/widgets.example.com/v1beta1",
        LEGACY_CT,
        WIDGETS_V1BETA1.as_bytes().to_vec(),
        true,
    );
    f
}

#[derive(Default)]
struct Round {
    /// Every fetch of the round, initial and follow-ups, in dispatch order.
    fetches: Vec<Fetch>,
    errors: Vec<SyncError>,
    publish: Option<Publish>,
    publishes: usize,
}

impl Round {
    fn take(&mut self, step: kube_peer_proxy::discovery::sync::Step) -> Vec<Fetch> {
        self.errors.extend(step.errors);
        if step.publish.is_some() {
            self.publishes += 1;
            self.publish = step.publish;
        }
        step.fetches
    }

    fn paths(&self, cluster: &str) -> BTreeSet<String> {
        self.fetches
            .iter()
            .filter(|f| f.cluster == cluster)
            .map(|f| f.path().to_string())
            .collect()
    }

    fn error_kinds(&self) -> Vec<(&str, &str)> {
        let mut v: Vec<(&str, &str)> = self
            .errors
            .iter()
            .map(|e| (e.server.as_str(), e.kind.label()))
            .collect();
        v.sort_unstable();
        v
    }
}

/// Ticks at `now` and answers every fetch (and follow-up) from `fake`, in order, at `now`.
/// The tick's readiness probe is answered too (200 unless the fake says otherwise), first
/// and apart from the round's fetches.
fn round(s: &mut Syncer, fake: &Fake, now: u64) -> Round {
    let mut r = Round::default();
    let mut first = s.on_tick(now);
    if let Some(probe) = first.probe.take() {
        if let Some(outcome) = fake.serve(&probe) {
            let step = s.on_response(probe.id, outcome, now);
            r.take(step);
        }
    }
    let queue: VecDeque<Fetch> = r.take(first).into();
    answer(s, fake, queue, now, &mut r);
    r
}

fn answer(s: &mut Syncer, fake: &Fake, mut queue: VecDeque<Fetch>, now: u64, r: &mut Round) {
    while let Some(f) = queue.pop_front() {
        r.fetches.push(f.clone());
        let Some(outcome) = fake.serve(&f) else { continue };
        let step = s.on_response(f.id, outcome, now);
        queue.extend(r.take(step));
    }
}

fn route<'a>(t: &Table, method: &'a str, path: &'a str) -> Decision<'a> {
    let facts = RequestFacts {
        method,
        path,
        accept: None,
        peer_proxied: None,
    };
    let mut pick = |_: usize| 0;
    decide(&facts, Some(t), true, &mut pick)
}

fn to(index: usize, g: &str, v: &str, r: &str) -> Decision<'static> {
    Decision::Peer {
        index,
        gvr: Gvr {
            group: g.to_string().into(),
            version: v.to_string().into(),
            resource: r.to_string().into(),
        },
    }
}

/// Local, with a "type not served here" 404 guarded (a peer serves it too, or the picture is incomplete).
fn guarded(reason: LocalReason, g: &str, v: &str, r: &str) -> Decision<'static> {
    Decision::Guarded {
        reason,
        gvr: Gvr {
            group: g.to_string().into(),
            version: v.to_string().into(),
            resource: r.to_string().into(),
        },
    }
}

const PEER_B: usize = 1;
const PEER_C: usize = 2;

#[test]
fn first_tick_fetches_api_and_apis_from_every_server() {
    let mut s = Syncer::new(&config());
    assert_eq!(s.generation(), 0);
    assert_eq!(s.max_bytes(), 200_000);
    assert_eq!(s.fetch_timeout_ms(), 1000);
    assert_eq!(s.round_completed_ms(), None);
    let step = s.on_tick(0);
    assert!(step.errors.is_empty());
    assert!(step.publish.is_none());
    let got: Vec<(&str, &str)> = step.fetches.iter().map(|f| (f.cluster.as_str(), f.path())).collect();
    assert_eq!(
        got,
        [
            ("local", "/api"),
            ("local", "/apis"),
            ("peer-b", "/api"),
            ("peer-b", "/apis"),
            ("peer-c", "/api"),
            ("peer-c", "/apis")
        ]
    );
    let ids: BTreeSet<u64> = step.fetches.iter().map(|f| f.id).collect();
    assert_eq!(ids.len(), 6, "ids are unique");
    for f in &step.fetches {
        let want: Vec<(String, String)> = [
            (":method", "GET"),
            (":path", f.path()),
            (":authority", "kube.example"),
            ("accept", DISCOVERY_ACCEPT),
            (PEER_PROXIED_HEADER, "true"),
            ("authorization", "Bearer t0ken"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(f.headers, want, "{} {}", f.cluster, f.path());
        assert_eq!(header(f, "if-none-match"), None);
    }
    assert_eq!(
        DISCOVERY_ACCEPT,
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
    );
    // While the round is running, ticks do nothing.
    for now in [0, 10, 999, 2499] {
        let step = s.on_tick(now);
        assert!(
            step.fetches.is_empty() && step.errors.is_empty() && step.publish.is_none(),
            "tick at {now}"
        );
    }
}

#[test]
fn completed_round_publishes_a_routable_snapshot() {
    let mut s = Syncer::new(&config());
    let fake = fake();
    let r = round(&mut s, &fake, 0);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.publishes, 1, "one snapshot per round");
    let p = r.publish.expect("snapshot");
    assert_eq!(p.table.generation, 1);
    assert_eq!(s.generation(), 1);
    assert_eq!(s.round_completed_ms(), Some(0));
    let names: Vec<&str> = p.table.servers.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["local", "peer-b", "peer-c"]);
    assert_eq!(p.table.local_mask(), 1);
    assert_eq!(p.table.apis_etag, etag(&p.merged_apis()));
    assert_eq!(p.table.api_etag, etag(&p.merged_api()));
    assert_eq!(Table::decode(&p.table.encode()).expect("decode"), p.table);
    let status: Vec<(&str, Option<u64>)> = s.server_status().collect();
    assert_eq!(status, [("local", Some(0)), ("peer-b", Some(0)), ("peer-c", Some(0))]);

    use LocalReason::*;
    struct R {
        name: &'static str,
        method: &'static str,
        path: &'static str,
        want: Decision<'static>,
    }
    let rows = [
        R {
            name: "core pods local (peers serve them too: 404 guarded)",
            method: "GET",
            path: "/api/v1/namespaces/a/pods",
            want: guarded(ServedLocally, "", "v1", "pods"),
        },
        R {
            name: "pods/resize only on peer-b",
            method: "PATCH",
            path: "/api/v1/namespaces/a/pods/p/resize",
            want: to(PEER_B, "", "v1", "pods"),
        },
        R {
            name: "apps local (peers serve them too: 404 guarded)",
            method: "GET",
            path: "/apis/apps/v1/deployments",
            want: guarded(ServedLocally, "apps", "v1", "deployments"),
        },
        R {
            name: "resource.k8s.io/v1 only on peer-b",
            method: "GET",
            path: "/apis/resource.k8s.io/v1/resourceclaims",
            want: to(PEER_B, "resource.k8s.io", "v1", "resourceclaims"),
        },
        R {
            name: "1.33-only GVR local",
            method: "GET",
            path: "/apis/networking.k8s.io/v1beta1/ipaddresses",
            want: Decision::Local(ServedLocally),
        },
        R {
            name: "legacy peer-c group",
            method: "GET",
            path: "/apis/widgets.example.com/v1/namespaces/a/widgets/w/status",
            want: to(PEER_C, "widgets.example.com", "v1", "widgets"),
        },
        R {
            name: "legacy peer-c second version",
            method: "GET",
            path: "/apis/widgets.example.com/v1beta1/gadgets",
            want: to(PEER_C, "widgets.example.com", "v1beta1", "gadgets"),
        },
        R {
            name: "legacy peer-c group discovery",
            method: "GET",
            path: "/apis/widgets.example.com",
            want: to(PEER_C, "widgets.example.com", "", ""),
        },
        R {
            name: "nobody",
            method: "GET",
            path: "/apis/nope.io/v1/x",
            want: Decision::Local(NotServedAnywhere),
        },
    ];
    for row in rows {
        assert_eq!(route(&p.table, row.method, row.path), row.want, "{}", row.name);
    }
    // peer-c's legacy core v1 is in the table too (only peer-c has bindings here).
    assert_eq!(p.table.servers_for(&resource_key("", "v1", "bindings")), 0b100);
    assert_eq!(p.table.servers_for(&resource_key("", "v1", "pods")), 0b111);

    // The merged /apis is the union of every server's GVRs; merged /api the union of core.
    let merged: serde_json::Value = serde_json::from_slice(&p.merged_apis()).expect("merged apis");
    let mut want = json_gvrs(&serde_json::from_slice(&fixture(AGG_133)).expect("json"));
    want.extend(json_gvrs(&serde_json::from_slice(&fixture(AGG_137)).expect("json")));
    for (g, v, r) in [
        ("widgets.example.com", "v1", "widgets"),
        ("widgets.example.com", "v1beta1", "gadgets"),
        ("apps", "v1", "controllerrevisions"),
        ("apps", "v1", "daemonsets"),
        ("apps", "v1", "deployments"),
        ("apps", "v1", "replicasets"),
        ("apps", "v1", "statefulsets"),
    ] {
        want.insert((g.into(), v.into(), r.into()));
    }
    assert_eq!(json_gvrs(&merged), want);
    let api = parse_aggregated(&p.merged_api()).expect("merged api");
    assert_eq!(api.items.len(), 1);
    let core = api.items.first().expect("core");
    assert_eq!(core.metadata.name, "");
    let pods = core
        .versions
        .first()
        .and_then(|v| v.resources.iter().find(|r| r.resource == "pods"))
        .expect("pods");
    let subs: Vec<&str> = pods.subresources.iter().map(|x| x.subresource.as_str()).collect();
    assert_eq!(
        subs,
        [
            "attach",
            "binding",
            "ephemeralcontainers",
            "eviction",
            "exec",
            "log",
            "portforward",
            "proxy",
            "resize",
            "status"
        ]
    );
}

#[test]
fn legacy_server_gets_follow_up_fetches() {
    let mut s = Syncer::new(&config());
    let fake = fake();
    let r = round(&mut s, &fake, 0);
    let want: BTreeSet<String> = [
        "/api",
        "/apis",
        "/api/v1",
        "/apis/apps/v1",
        "/apis/widgets.example.com/v1",
        "/apis/widgets.example.com/v1beta1",
        "/openapi/v3",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    assert_eq!(r.paths("peer-c"), want);
    assert_eq!(
        r.paths("peer-b"),
        ["/api".to_string(), "/apis".to_string()].into_iter().collect()
    );
    for f in r.fetches.iter().filter(|f| f.cluster == "peer-c") {
        let accept = if f.path() == "/openapi/v3" {
            "application/json"
        } else {
            DISCOVERY_ACCEPT
        };
        assert_eq!(header(f, "accept"), Some(accept), "{}", f.path());
        assert_eq!(header(f, PEER_PROXIED_HEADER), Some("true"), "{}", f.path());
        assert_eq!(header(f, ":authority"), Some("kube.example"), "{}", f.path());
        assert_eq!(header(f, "authorization"), Some("Bearer t0ken"), "{}", f.path());
    }
    assert!(r.publish.is_some());
}

#[test]
fn real_legacy_group_list_is_walked() {
    fn fallback(cluster: &str, path: &str) -> Option<Outcome> {
        // Every /apis/<g>/<v> of the 1.31 group list answers with one resource named after it.
        let rest = path.strip_prefix("/apis/")?;
        let (g, v) = rest.split_once('/')?;
        (cluster == "local").then(|| Outcome::Response {
            status: 200,
            content_type: LEGACY_CT.into(),
            etag: None,
            body: Body::Bytes(format!(
                r#"{{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"{g}/{v}","resources":[{{"name":"things","singularName":"thing","namespaced":true,"kind":"Thing","verbs":["get"]}},{{"name":"things/status","singularName":"","namespaced":true,"kind":"Thing","verbs":["get"]}}]}}"#
            )
            .into_bytes()),
        })
    }
    let mut c = Config::parse(br#"{"local_cluster":"local"}"#).expect("config");
    c.discovery_headers.clear();
    let mut s = Syncer::new(&c);
    let mut f = Fake {
        fallback: Some(fallback),
        ..Fake::default()
    };
    f.doc("local", "/api", LEGACY_CT, fixture("legacy_api.json"), false);
    f.doc(
        "local",
        "/api/v1",
        LEGACY_CT,
        fixture("legacy_api__v1.k8s-pre-1.33.json"),
        false,
    );
    f.doc("local", "/apis", LEGACY_CT, fixture("legacy_apis.k8s-1.31.json"), false);
    let r = round(&mut s, &f, 0);
    // No OpenAPI index here (404): the group list alone is walked.
    assert_eq!(r.error_kinds(), [("local", "http_status")]);
    // 2 roots + /api/v1 + 32 group versions + /openapi/v3.
    assert_eq!(r.fetches.len(), 36);
    let p = r.publish.expect("snapshot");
    let groups = serde_json::from_slice::<serde_json::Value>(&fixture("legacy_apis.k8s-1.31.json")).expect("json");
    for g in groups["groups"].as_array().expect("groups") {
        let name = g["name"].as_str().expect("name");
        for v in g["versions"].as_array().expect("versions") {
            let version = v["version"].as_str().expect("version");
            assert_eq!(
                p.table.servers_for(&resource_key(name, version, "things")),
                1,
                "{name}/{version}"
            );
            assert_eq!(
                p.table.servers_for(&format!("s/{name}/{version}/things/status")),
                1,
                "{name}/{version}"
            );
        }
    }
    // The merged /apis keeps the legacy group order.
    let merged = parse_aggregated(&p.merged_apis()).expect("merged");
    let got: Vec<&str> = merged.items.iter().map(|g| g.metadata.name.as_str()).collect();
    let want: Vec<&str> = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["name"].as_str().expect("n"))
        .collect();
    assert_eq!(got, want);
    assert_eq!(p.table.servers_for(&resource_key("", "v1", "pods")), 1);
}

#[test]
fn etags_are_sent_and_304_reuses_the_cache() {
    let mut s = Syncer::new(&config());
    let fake = fake();
    let first = round(&mut s, &fake, 0);
    let first = first.publish.expect("snapshot");
    assert!(first.keys_changed, "the first snapshot's entries are written");
    let table1 = first.table;

    let second = round(&mut s, &fake, 1000);
    assert!(second.errors.is_empty(), "{:?}", second.errors);
    for f in &second.fetches {
        let doc = fake
            .docs
            .get(&(f.cluster.clone(), f.path().to_string()))
            .expect("known doc");
        assert_eq!(
            header(f, "if-none-match"),
            doc.etag.as_deref(),
            "{} {}",
            f.cluster,
            f.path()
        );
    }
    // Every document with an ETag was answered 304; /apis/apps/v1 on peer-c (no ETag) was fetched in full.
    assert_eq!(fake.not_modified.get(), 10);
    assert_eq!(
        second.fetches.len(),
        11,
        "legacy follow-ups are issued again from the cached documents"
    );
    assert!(second.publish.is_none(), "nothing changed: no republish");
    assert_eq!(second.publishes, 0);
    assert_eq!(s.generation(), 1);
    assert_eq!(s.round_completed_ms(), Some(1000));
    let status: Vec<(&str, Option<u64>)> = s.server_status().collect();
    assert_eq!(
        status,
        [("local", Some(1000)), ("peer-b", Some(1000)), ("peer-c", Some(1000))]
    );
    // The table still routes the same way.
    assert_eq!(
        route(&table1, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
    );

    // A changed document is fetched in full and republished.
    let mut changed = fake.clone();
    changed.aggregated("peer-b", "/apis", fixture(AGG_133));
    let third = round(&mut s, &changed, 2000);
    assert!(third.errors.is_empty(), "{:?}", third.errors);
    let p = third.publish.expect("republish");
    assert_eq!(p.table.generation, 2);
    // A new key set: new entries, in the other slot, under a newer version.
    assert!(p.keys_changed);
    assert_ne!(p.table.keys_slot, table1.keys_slot);
    assert!(p.table.keys_version > table1.keys_version);
    assert_eq!(p.table.built_ms, 2000);
    assert_eq!(s.generation(), 2);
    assert_eq!(
        route(&p.table, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        Decision::Local(LocalReason::NotServedAnywhere)
    );
    // The new ETag is used next time.
    let fourth = round(&mut s, &changed, 3000);
    let f = fourth
        .fetches
        .iter()
        .find(|f| f.cluster == "peer-b" && f.path() == "/apis")
        .expect("peer-b /apis");
    assert_eq!(header(f, "if-none-match"), Some(etag(&fixture(AGG_133)).as_str()));
    assert!(fourth.publish.is_none());
}

#[test]
fn api_404_is_tolerated() {
    let mut s = Syncer::new(&config());
    let mut fake = fake();
    fake.docs.remove(&("peer-b".to_string(), "/api".to_string()));
    let r = round(&mut s, &fake, 0);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let p = r.publish.expect("snapshot");
    // peer-b contributes its /apis but no core group.
    assert_eq!(
        route(&p.table, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
    );
    // Its core group is known to be empty: pods/resize is served by nobody, so the local parent
    // answers and its 404 (about the subresource) is genuine.
    assert_eq!(
        route(&p.table, "GET", "/api/v1/namespaces/a/pods/p/resize"),
        Decision::Local(LocalReason::ServedLocally)
    );
    assert_eq!(p.table.servers_for(&resource_key("", "v1", "pods")), 0b101);
    assert_eq!(p.table.known_core, 0b111, "an empty core group is known");
    // The same 404 next round (and 304s elsewhere) is no change: no rebuild, no new snapshot.
    assert_eq!(s.builds(), 1);
    let again = round(&mut s, &fake, 1000);
    assert!(again.fetches.len() >= 6, "a whole round ran");
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    assert!(again.publish.is_none(), "an unchanged round must not republish");
    assert_eq!(s.builds(), 1, "an unchanged round must not even rebuild");

    // A 404 on /apis is an error.
    let mut s = Syncer::new(&config());
    let mut fake = self::fake();
    fake.docs.remove(&("peer-b".to_string(), "/apis".to_string()));
    let r = round(&mut s, &fake, 0);
    assert_eq!(r.error_kinds(), [("peer-b", "http_status")]);
    let p = r.publish.expect("snapshot");
    assert_eq!(
        p.table.known_groups, 0b101,
        "peer-b's /apis is unknown, its /api counts"
    );
    assert_eq!(p.table.known_core, 0b111);
}

fn response(status: u16, content_type: &str, body: &[u8]) -> Option<Outcome> {
    Some(Outcome::Response {
        status,
        content_type: content_type.into(),
        etag: None,
        body: Body::Bytes(body.to_vec()),
    })
}

#[test]
fn failures_keep_last_good_data_until_the_staleness_limit() {
    struct F {
        desc: &'static str,
        path: &'static str,
        outcome: Option<Outcome>,
        kind: &'static str,
        /// The server could not be reached (as opposed to a bad answer): it stays in the table with
        /// its last good data but is marked unhealthy, so requests it alone serves get a 503.
        unreachable: bool,
    }
    let rows = [
        F {
            desc: "malformed JSON",
            path: "/apis",
            outcome: response(200, CONTENT_TYPE_V2, b"{not json"),
            kind: "decode",
            unreachable: false,
        },
        F {
            desc: "wrong kind",
            path: "/apis",
            outcome: response(200, CONTENT_TYPE_V2, br#"{"kind":"APIGroupList","groups":[]}"#),
            kind: "decode",
            unreachable: false,
        },
        F {
            desc: "legacy garbage",
            path: "/api",
            outcome: response(200, LEGACY_CT, b"<html>"),
            kind: "decode",
            unreachable: false,
        },
        F {
            desc: "HTTP 500",
            path: "/apis",
            outcome: response(500, "application/json", b"{}"),
            kind: "http_status",
            unreachable: false,
        },
        F {
            desc: "HTTP 403",
            path: "/api",
            outcome: response(403, "application/json", b"{}"),
            kind: "http_status",
            unreachable: false,
        },
        F {
            desc: "oversized (host)",
            path: "/apis",
            outcome: Some(Outcome::Oversized),
            kind: "oversized",
            unreachable: false,
        },
        F {
            desc: "oversized body",
            path: "/apis",
            outcome: response(200, CONTENT_TYPE_V2, &vec![b' '; 200_001]),
            kind: "oversized",
            unreachable: false,
        },
        F {
            desc: "HTTP 503 from the server",
            path: "/apis",
            outcome: response(503, "application/json", b"{}"),
            kind: "unavailable",
            unreachable: false,
        },
        F {
            desc: "HTTP 504",
            path: "/api",
            outcome: response(504, "text/plain", b"upstream request timeout"),
            kind: "timeout",
            unreachable: false,
        },
        F {
            desc: "no response (reset)",
            path: "/apis",
            outcome: Some(Outcome::NoResponse),
            kind: "reset",
            unreachable: false,
        },
        F {
            desc: "cannot connect",
            path: "/apis",
            outcome: Some(Outcome::Unreachable),
            kind: "unreachable",
            unreachable: true,
        },
    ];
    let claims = || Gvr {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        resource: "resourceclaims".into(),
    };
    for row in rows {
        let mut s = Syncer::new(&config());
        let good = fake();
        let first = round(&mut s, &good, 0);
        let t1 = first.publish.expect("first snapshot").table;
        assert_eq!(t1.unhealthy, 0);
        assert_eq!(
            route(&t1, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
            to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
        );

        let mut bad = good.clone();
        bad.set("peer-b", row.path, row.outcome.clone());

        // Within the staleness limit (3 s after the last success at t=0) peer-b keeps its data.
        let mut current = t1.clone();
        for now in [1000, 2000, 3000] {
            let r = round(&mut s, &bad, now);
            assert_eq!(r.error_kinds(), [("peer-b", row.kind)], "{} at {now}", row.desc);
            let e = r.errors.first().expect("error");
            assert!(
                e.detail.starts_with(&format!("{}: ", row.path)),
                "{}: detail {:?}",
                row.desc,
                e.detail
            );
            match (row.unreachable, now, r.publish) {
                (false, _, None) => {}
                (true, 1000, Some(p)) => {
                    // Same data, peer-b marked unhealthy.
                    assert_eq!(p.table.generation, 2, "{}", row.desc);
                    assert_eq!(p.table.keys, t1.keys, "{}: peer-b keeps its last good data", row.desc);
                    // The same key set: its shared-data entries are not written again.
                    assert!(!p.keys_changed, "{}", row.desc);
                    assert_eq!(
                        (p.table.keys_slot, p.table.keys_version),
                        (t1.keys_slot, t1.keys_version),
                        "{}",
                        row.desc
                    );
                    assert_eq!(p.table.servers, t1.servers, "{}", row.desc);
                    assert_eq!(p.table.unhealthy, 1 << PEER_B, "{}", row.desc);
                    current = p.table;
                }
                (true, 2000 | 3000, None) => {}
                (_, _, p) => panic!(
                    "{} at {now}: unexpected publish {:?}",
                    row.desc,
                    p.map(|p| p.table.generation)
                ),
            }
            let want = if row.unreachable {
                Decision::Unavailable { gvr: claims() }
            } else {
                to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
            };
            assert_eq!(
                route(&current, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
                want,
                "{} at {now}",
                row.desc
            );
            // What the local server serves is unaffected.
            assert_eq!(
                route(&current, "GET", "/apis/apps/v1/deployments"),
                guarded(LocalReason::ServedLocally, "apps", "v1", "deployments")
            );
        }
        let generation = s.generation();
        assert_eq!(generation, if row.unreachable { 2 } else { 1 }, "{}", row.desc);
        let status: HashMap<&str, Option<u64>> = s.server_status().collect();
        assert_eq!(status.get("peer-b"), Some(&Some(0)), "{}", row.desc);
        assert_eq!(status.get("local"), Some(&Some(3000)), "{}", row.desc);
        let answering: HashMap<&str, u64> = s.answering_clusters().collect();
        assert_eq!(answering.get("local"), Some(&3000), "{}", row.desc);
        assert_eq!(!answering.contains_key("peer-b"), row.unreachable, "{}", row.desc);

        // Past the limit peer-b stays a member and what it was last seen to serve still counts,
        // but the failing part is stale: not routed to, so what only it serves gets a 503.
        let r = round(&mut s, &bad, 4000);
        assert_eq!(r.error_kinds(), [("peer-b", row.kind)], "{}", row.desc);
        let p = r.publish.expect("snapshot with peer-b stale");
        assert_eq!(p.table.generation, generation + 1, "{}", row.desc);
        assert_eq!(p.table.servers, t1.servers, "{}: membership does not end", row.desc);
        assert_eq!(p.table.keys, t1.keys, "{}: last-known data is kept", row.desc);
        assert_eq!(
            p.table.unhealthy,
            if row.unreachable { 1 << PEER_B } else { 0 },
            "{}",
            row.desc
        );
        let groups_stale = row.path == "/apis";
        assert_eq!(p.table.fresh_groups & (1 << PEER_B) == 0, groups_stale, "{}", row.desc);
        assert_eq!(p.table.fresh_core & (1 << PEER_B) == 0, !groups_stale, "{}", row.desc);
        let want = if row.unreachable || groups_stale {
            Decision::Unavailable { gvr: claims() }
        } else {
            // Only /api fails: its /apis part is fresh and still routes.
            to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
        };
        assert_eq!(
            route(&p.table, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
            want,
            "{}",
            row.desc
        );
        // A resource nobody serves is a genuine 404: every member's API set is known.
        assert_eq!(
            route(&p.table, "GET", "/apis/nope.io/v1/things"),
            Decision::Local(LocalReason::NotServedAnywhere),
            "{}",
            row.desc
        );
        assert_eq!(
            route(&p.table, "GET", "/apis/widgets.example.com/v1/widgets"),
            to(PEER_C, "widgets.example.com", "v1", "widgets")
        );
        let merged: serde_json::Value = serde_json::from_slice(&p.merged_apis()).expect("json");
        assert!(json_gvrs(&merged).contains(&(
            "lifecycle.k8s.io".into(),
            "v1alpha1".into(),
            "evictionrequests".into()
        )));

        // Recovery brings it back.
        let r = round(&mut s, &good, 5000);
        assert!(r.errors.is_empty(), "{}: {:?}", row.desc, r.errors);
        let p = r.publish.expect("snapshot with peer-b again");
        assert_eq!(p.table.generation, generation + 2);
        assert_eq!(p.table.unhealthy, 0);
        assert_eq!(
            route(&p.table, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
            to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
        );
    }
}

#[test]
fn unreachable_then_answering_again_within_the_limit() {
    let mut s = Syncer::new(&config());
    let good = fake();
    round(&mut s, &good, 0);
    let mut down = good.clone();
    down.set("peer-b", "/api", Some(Outcome::Unreachable));
    down.set("peer-b", "/apis", Some(Outcome::Unreachable));
    let p = round(&mut s, &down, 1000).publish.expect("unhealthy");
    assert_eq!(p.table.unhealthy, 1 << PEER_B);
    // Answers again (304s from the cache): healthy again, same data.
    let r = round(&mut s, &good, 2000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let p2 = r.publish.expect("healthy again");
    assert_eq!(p2.table.unhealthy, 0);
    assert_eq!(p2.table.keys, p.table.keys);
    assert_eq!(
        route(&p2.table, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
    );
    let answering: HashMap<&str, u64> = s.answering_clusters().collect();
    assert_eq!(answering.get("peer-b"), Some(&2000));
}

#[test]
fn not_modified_without_a_cached_document_is_an_error() {
    let mut s = Syncer::new(&config());
    let mut fake = fake();
    fake.set("peer-b", "/apis", response(304, "", b""));
    let r = round(&mut s, &fake, 0);
    assert_eq!(r.error_kinds(), [("peer-b", "http_status")]);
    let e = r.errors.first().expect("error");
    assert!(e.detail.contains("304"), "{:?}", e.detail);
    let p = r.publish.expect("snapshot");
    assert_eq!(p.table.servers.len(), 3, "peer-b is a member");
    assert_eq!(p.table.known_groups & (1 << PEER_B), 0, "whose /apis is unknown");
    assert_ne!(p.table.known_core & (1 << PEER_B), 0, "and whose /api is known");
}

#[test]
fn a_document_of_the_wrong_type_for_its_path_is_a_decode_error() {
    let mut s = Syncer::new(&config());
    let mut fake = fake();
    // An APIVersions answer where /apis belongs: parses as legacy, but is not a group list.
    fake.set(
        "peer-b",
        "/apis",
        response(200, "application/json", br#"{"kind":"APIVersions","versions":["v1"]}"#),
    );
    let r = round(&mut s, &fake, 0);
    assert_eq!(r.error_kinds(), [("peer-b", "decode")]);
    let p = r.publish.expect("snapshot");
    assert_eq!(p.table.known_groups & (1 << PEER_B), 0, "peer-b's /apis is unknown");
    assert!(p.table.incomplete("apps", "v1"));
    assert!(!p.table.incomplete("", "v1"));
}

#[test]
fn failing_legacy_follow_up_keeps_the_old_data() {
    let mut s = Syncer::new(&config());
    let good = fake();
    let first = round(&mut s, &good, 0);
    assert!(first.publish.is_some());
    let mut bad = good.clone();
    bad.set(
        "peer-c",
        "/apis/widgets.example.com/v1beta1",
        response(500, "application/json", b"{}"),
    );
    let r = round(&mut s, &bad, 1000);
    assert_eq!(r.error_kinds(), [("peer-c", "http_status")]);
    assert!(
        r.publish.is_none(),
        "the old resources of that group/version are kept: no change"
    );
    let r = round(&mut s, &bad, 4000);
    assert!(
        r.publish.is_none(),
        "the rest of the walk answers: the part stays fresh"
    );
    let t = first.publish.expect("first").table;
    assert_eq!(
        route(&t, "GET", "/apis/widgets.example.com/v1beta1/gadgets"),
        to(PEER_C, "widgets.example.com", "v1beta1", "gadgets")
    );

    // A follow-up that fails from the start: only that group/version is unknown.
    let mut s = Syncer::new(&config());
    let r = round(&mut s, &bad, 0);
    assert_eq!(r.error_kinds(), [("peer-c", "http_status")]);
    let t = r.publish.expect("snapshot").table;
    assert!(t.incomplete("widgets.example.com", "v1beta1"));
    assert!(!t.incomplete("widgets.example.com", "v1"));
    assert!(!t.incomplete("apps", "v1"));
    assert_eq!(
        route(&t, "GET", "/apis/widgets.example.com/v1beta1/gadgets"),
        guarded(
            LocalReason::NotServedAnywhere,
            "widgets.example.com",
            "v1beta1",
            "gadgets"
        )
    );
    assert_eq!(
        route(&t, "GET", "/apis/widgets.example.com/v1beta1"),
        to(PEER_C, "widgets.example.com", "v1beta1", ""),
        "the group list says peer-c serves the group/version itself"
    );
    assert_eq!(
        route(&t, "GET", "/apis/widgets.example.com/v1/widgets"),
        to(PEER_C, "widgets.example.com", "v1", "widgets")
    );
}

#[test]
fn a_member_that_never_answered_is_unknown() {
    let mut s = Syncer::new(&config());
    let mut fake = fake();
    fake.set("peer-b", "/api", Some(Outcome::NoResponse));
    let r = round(&mut s, &fake, 0);
    assert_eq!(r.error_kinds(), [("peer-b", "reset")]);
    let p = r.publish.expect("snapshot");
    assert_eq!(
        p.table.servers.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
        ["local", "peer-b", "peer-c"]
    );
    assert_eq!(p.table.known_core, 0b101, "peer-b's /api is unknown");
    assert_eq!(p.table.known_groups, 0b111, "its /apis counts");
    assert_eq!(
        route(&p.table, "GET", "/api/v1/nosuchthings"),
        guarded(LocalReason::NotServedAnywhere, "", "v1", "nosuchthings")
    );
    assert_eq!(
        route(&p.table, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
    );
    let status: HashMap<&str, Option<u64>> = s.server_status().collect();
    assert_eq!(status.get("peer-b"), Some(&None));
}

#[test]
fn unanswered_round_ends_at_the_deadline() {
    let mut s = Syncer::new(&config());
    let fake = fake();
    let mut silent = fake.clone();
    for cluster in ["local", "peer-b", "peer-c"] {
        for path in ["/api", "/apis"] {
            silent.set(cluster, path, None);
        }
    }
    let r = round(&mut s, &silent, 0);
    assert_eq!(r.fetches.len(), 6);
    assert!(r.publish.is_none());
    // Before the deadline nothing happens.
    let step = s.on_tick(2000);
    assert!(step.fetches.is_empty() && step.errors.is_empty() && step.publish.is_none());

    let step = s.on_tick(1_000_000_000);
    let mut kinds: Vec<(&str, &str)> = step
        .errors
        .iter()
        .map(|e| (e.server.as_str(), e.kind.label()))
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            ("local", "timeout"),
            ("local", "timeout"),
            ("peer-b", "timeout"),
            ("peer-b", "timeout"),
            ("peer-c", "timeout"),
            ("peer-c", "timeout")
        ]
    );
    // The round ends (a snapshot of members with nothing known) and a new round starts right away.
    let p = step.publish.expect("round end");
    assert_eq!(p.table.servers.len(), 3);
    assert_eq!((p.table.known_core, p.table.known_groups), (0, 0));
    assert!(p.table.keys.is_empty());
    assert_eq!(step.fetches.len(), 6);
    assert_eq!(s.round_completed_ms(), Some(1_000_000_000));

    // Late answers to the old round are ignored.
    for f in &r.fetches {
        let late = s.on_response(f.id, fake.serve(f).expect("answer"), 1_000_000_001);
        assert!(late.fetches.is_empty() && late.errors.is_empty() && late.publish.is_none());
    }
    // Answering the new round works normally.
    let mut r2 = Round::default();
    answer(&mut s, &fake, step.fetches.into(), 1_000_000_002, &mut r2);
    assert!(r2.errors.is_empty(), "{:?}", r2.errors);
    assert_eq!(r2.publish.expect("snapshot").table.servers.len(), 3);
}

#[test]
fn partially_answered_round_ends_at_the_deadline() {
    let mut s = Syncer::new(&config());
    let mut fake = fake();
    fake.set("peer-b", "/apis", None);
    let r = round(&mut s, &fake, 0);
    assert!(r.errors.is_empty());
    assert!(r.publish.is_none(), "the round waits for peer-b");
    let step = s.on_tick(3500);
    let kinds: Vec<(&str, &str)> = step
        .errors
        .iter()
        .map(|e| (e.server.as_str(), e.kind.label()))
        .collect();
    assert_eq!(kinds, [("peer-b", "timeout")]);
    let p = step.publish.expect("snapshot");
    assert_eq!(p.table.servers.len(), 3);
    assert_eq!(p.table.known_groups, 0b101, "peer-b's /apis never answered");
    assert_eq!(p.table.built_ms, 3500);
    assert_eq!(step.fetches.len(), 6, "next round is due (started at 0, refresh 1s)");
}

#[test]
fn unknown_and_duplicate_ids_are_ignored() {
    let mut s = Syncer::new(&config());
    let fake = fake();
    let step = s.on_tick(0);
    let ok = Outcome::Response {
        status: 200,
        content_type: CONTENT_TYPE_V2.into(),
        etag: None,
        body: Body::Bytes(core_doc(&[])),
    };
    for id in [0, 999_999, u64::MAX] {
        let st = s.on_response(id, ok.clone(), 0);
        assert!(
            st.fetches.is_empty() && st.errors.is_empty() && st.publish.is_none(),
            "id {id}"
        );
    }
    let f = step.fetches.first().expect("fetch").clone();
    let once = s.on_response(f.id, fake.serve(&f).expect("answer"), 0);
    assert!(once.errors.is_empty());
    let twice = s.on_response(f.id, Outcome::NoResponse, 0);
    assert!(
        twice.errors.is_empty() && twice.publish.is_none(),
        "a second answer to the same id is ignored"
    );
    let mut r = Round::default();
    answer(&mut s, &fake, step.fetches.into_iter().skip(1).collect(), 0, &mut r);
    assert!(r.errors.is_empty());
    assert!(r.publish.is_some());
}

#[test]
fn merge_is_independent_of_peer_order_and_answer_order() {
    let fake = fake();
    let with_peers = |peers: &str| {
        let json = format!(
            r#"{{"local_cluster":"local","local_name":"local","peers":{peers},"refresh_interval":"1s","staleness_limit":"3s"}}"#
        );
        Config::parse(json.as_bytes()).expect("config")
    };
    let a = with_peers(r#"[{"name":"peer-b","cluster":"peer-b"},{"name":"peer-c","cluster":"peer-c"}]"#);
    let b = with_peers(r#"[{"name":"peer-c","cluster":"peer-c"},{"name":"peer-b","cluster":"peer-b"}]"#);

    let mut s1 = Syncer::new(&a);
    let p1 = round(&mut s1, &fake, 42).publish.expect("p1");

    // Other peer order, and answers delivered in reverse.
    let mut s2 = Syncer::new(&b);
    let step = s2.on_tick(42);
    let mut r2 = Round::default();
    let mut reversed: Vec<Fetch> = step.fetches;
    reversed.reverse();
    answer(&mut s2, &fake, reversed.into(), 42, &mut r2);
    let p2 = r2.publish.expect("p2");

    assert_eq!(p1.merged_apis(), p2.merged_apis(), "merged /apis is byte-identical");
    assert_eq!(p1.merged_api(), p2.merged_api(), "merged /api is byte-identical");
    assert_eq!(p1.table.encode(), p2.table.encode(), "table is byte-identical");
    assert_eq!(p1, p2);

    // And the same again from a third syncer.
    let mut s3 = Syncer::new(&a);
    let p3 = round(&mut s3, &fake, 42).publish.expect("p3");
    assert_eq!(p1, p3);
}

#[test]
fn servers_in_name_order_the_local_one_not_privileged() {
    // A peer whose name sorts before the local server comes first: every node builds the same merge.
    let json =
        r#"{"local_cluster":"zz-local","local_name":"zz-local","peers":[{"name":"aa-peer","cluster":"aa-peer"}]}"#;
    let mut s = Syncer::new(&Config::parse(json.as_bytes()).expect("config"));
    let mut fake = Fake::default();
    let mut local_res = res("things", &[]);
    local_res.singular_resource = "local-singular".into();
    let mut peer_res = res("things", &["status"]);
    peer_res.singular_resource = "peer-singular".into();
    fake.aggregated(
        "zz-local",
        "/apis",
        to_v2_json(&[group("x.io", vec![ver("v1", vec![local_res])])]),
    );
    fake.aggregated(
        "aa-peer",
        "/apis",
        to_v2_json(&[group("x.io", vec![ver("v1", vec![peer_res])])]),
    );
    let r = round(&mut s, &fake, 0);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let p = r.publish.expect("snapshot");
    assert_eq!(
        p.table.servers.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
        ["aa-peer", "zz-local"]
    );
    let merged = parse_aggregated(&p.merged_apis()).expect("merged");
    let things = merged
        .items
        .first()
        .and_then(|g| g.versions.first())
        .and_then(|v| v.resources.first())
        .expect("things");
    assert_eq!(
        things.singular_resource, "peer-singular",
        "the first server by name wins"
    );
    assert_eq!(things.subresources.len(), 1);
    // Both /api answered 404: the merged /api is an empty list.
    assert_eq!(parse_aggregated(&p.merged_api()).expect("api").items.len(), 0);
    assert_eq!(
        route(&p.table, "PUT", "/apis/x.io/v1/namespaces/a/things/t/status"),
        to(0, "x.io", "v1", "things")
    );
    assert_eq!(
        route(&p.table, "GET", "/apis/x.io/v1/things"),
        guarded(LocalReason::ServedLocally, "x.io", "v1", "things")
    );
}

#[test]
fn huge_durations_do_not_overflow() {
    let c = Config::parse(
        br#"{"local_cluster":"local","refresh_interval":"18446744073709551615s","fetch_timeout":"18446744073709551615s","staleness_limit":"18446744073709551615s"}"#,
    )
    .expect("config");
    let mut s = Syncer::new(&c);
    assert_eq!(s.fetch_timeout_ms(), u64::MAX);
    let mut fake = Fake::default();
    fake.aggregated(
        "local",
        "/apis",
        to_v2_json(&[group("x.io", vec![ver("v1", vec![res("things", &[])])])]),
    );
    // The round is still waiting long after any realistic time: the deadline saturates.
    let step = s.on_tick(0);
    assert_eq!(step.fetches.len(), 2);
    let later = s.on_tick(u64::MAX - 1);
    assert!(later.fetches.is_empty() && later.errors.is_empty() && later.publish.is_none());
    let mut r = Round::default();
    answer(&mut s, &fake, step.fetches.into(), 1_000, &mut r);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let p = r.publish.expect("snapshot");
    assert_eq!(
        route(&p.table, "GET", "/apis/x.io/v1/things"),
        Decision::Local(LocalReason::ServedLocally)
    );
    // No new round before the (saturated) refresh time.
    assert!(s.on_tick(u64::MAX - 1).fetches.is_empty());
}

// --- Lease mode ----------------------------------------------------------------------------------

const LEASE_CONFIG: &str = r#"{
    "local_name": "host-a",
    "local_cluster": "local",
    "lease_discovery": {"cluster": "peers-by-address", "address_header": "x-kube-peer-proxy-peer-address",
                        "local_hostname": "host-a", "hosts": {"host-d": "127.0.0.14:6443"}},
    "refresh_interval": "1s",
    "fetch_timeout": "1s",
    "staleness_limit": "3s"
}"#;

/// One identity lease as kube-apiserver writes it (`renew_s`: renewTime in seconds since the epoch).
fn lease(host: &str, holder: &str, address: Option<&str>, renew_s: u64, duration_s: u64) -> serde_json::Value {
    let id = format!("apiserver-{host}");
    let mut annotations = serde_json::Map::new();
    if let Some(a) = address {
        annotations.insert("kubernetes.io/peer-advertise-address".into(), a.into());
    }
    let renew = if renew_s == 0 {
        "1970-01-01T00:00:00.000000Z".to_string()
    } else {
        // Seconds since the epoch as RFC 3339 (days are enough for these tests: renew_s < 86400).
        format!(
            "1970-01-01T{:02}:{:02}:{:02}.000000Z",
            renew_s / 3600,
            renew_s / 60 % 60,
            renew_s % 60
        )
    };
    serde_json::json!({
        "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
        "metadata": {"name": id, "namespace": "kube-system",
                     "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": host},
                     "annotations": annotations},
        "spec": {"holderIdentity": format!("{id}_{holder}"), "leaseDurationSeconds": duration_s, "renewTime": renew}
    })
}

fn lease_list(items: Vec<serde_json::Value>) -> Option<Outcome> {
    let body = serde_json::json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1",
                                  "metadata": {"resourceVersion": "1"}, "items": items});
    response(200, "application/json", body.to_string().as_bytes())
}

fn lease_fake() -> Fake {
    let mut f = Fake::default();
    f.aggregated("local", "/api", core_doc(&["status", "exec"]));
    f.aggregated("local", "/apis", fixture(AGG_133));
    f.aggregated("127.0.0.12:6443", "/api", core_doc(&["status", "exec", "resize"]));
    f.aggregated("127.0.0.12:6443", "/apis", fixture(AGG_137));
    f.aggregated("127.0.0.14:6443", "/api", core_doc(&["status"]));
    f.aggregated("127.0.0.14:6443", "/apis", fixture(AGG_133));
    f
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver";

#[test]
fn lease_mode_members_join_restart_leave_and_expire() {
    let mut s = Syncer::new(&Config::parse(LEASE_CONFIG.as_bytes()).expect("config"));
    let mut fake = lease_fake();
    let hour = 3600;
    // a: our own lease (excluded); b: annotated; c: no address anywhere (a member that can never be
    // learned); d: address from the configured hosts map.
    fake.set(
        "local",
        LEASES,
        lease_list(vec![
            lease("host-a", "1", Some("127.0.0.11:6443"), 10, hour),
            lease("host-b", "1", Some("127.0.0.12:6443"), 10, hour),
            lease("host-c", "1", None, 10, hour),
            lease("host-d", "1", None, 10, hour),
        ]),
    );
    let r = round(&mut s, &fake, 20_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let lease_fetch = r
        .fetches
        .iter()
        .find(|f| f.path() == LEASES)
        .expect("lease list fetched");
    assert_eq!(
        lease_fetch.cluster, "local",
        "leases are read through the local apiserver"
    );
    let b = r
        .fetches
        .iter()
        .filter(|f| header(f, LEASE_ADDRESS_HEADER) == Some("127.0.0.12:6443"))
        .map(|f| (f.cluster.as_str(), f.path()))
        .collect::<BTreeSet<_>>();
    assert_eq!(
        b,
        BTreeSet::from([("peers-by-address", "/api"), ("peers-by-address", "/apis")])
    );
    assert!(
        r.fetches
            .iter()
            .all(|f| header(f, LEASE_ADDRESS_HEADER) != Some("127.0.0.11:6443")),
        "never our own lease"
    );
    let t = r.publish.expect("snapshot").table;
    let names: Vec<&str> = t.servers.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["host-a", "host-b", "host-c", "host-d"]);
    assert!(!t.membership_unknown);
    assert_eq!(t.servers[1].address.as_deref(), Some("127.0.0.12:6443"));
    assert_eq!(t.servers[3].address.as_deref(), Some("127.0.0.14:6443"));
    assert_eq!(t.known_groups, 0b1011, "host-c can never be learned");
    assert_eq!(
        route(&t, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        to(1, "resource.k8s.io", "v1", "resourceclaims")
    );
    // host-c's API set is unknown: a resource nobody is known to serve is guarded.
    assert_eq!(
        route(&t, "GET", "/apis/nope.io/v1/things"),
        guarded(LocalReason::NotServedAnywhere, "nope.io", "v1", "things")
    );

    // host-c goes; host-b restarts (new holder): its API set is unknown until refetched, which
    // happens in the same round.
    fake.set(
        "local",
        LEASES,
        lease_list(vec![
            lease("host-a", "1", Some("127.0.0.11:6443"), 20, hour),
            lease("host-b", "2", Some("127.0.0.12:6443"), 20, hour),
            lease("host-d", "1", None, 20, hour),
        ]),
    );
    let r = round(&mut s, &fake, 21_000);
    let b_fetches = r
        .fetches
        .iter()
        .filter(|f| header(f, LEASE_ADDRESS_HEADER) == Some("127.0.0.12:6443"))
        .count();
    assert_eq!(b_fetches, 4, "the round's fetches plus the refetch after the restart");
    let b_refetch = r
        .fetches
        .iter()
        .rfind(|f| header(f, LEASE_ADDRESS_HEADER) == Some("127.0.0.12:6443"))
        .expect("refetch");
    assert_eq!(
        header(b_refetch, "if-none-match"),
        None,
        "a restarted server's ETags are forgotten"
    );
    let t = r.publish.expect("snapshot").table;
    let names: Vec<&str> = t.servers.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["host-a", "host-b", "host-d"], "host-c left when its lease went");
    assert_eq!(t.known_groups, 0b111);
    assert_eq!(
        route(&t, "GET", "/apis/nope.io/v1/things"),
        Decision::Local(LocalReason::NotServedAnywhere)
    );

    // The lease list cannot be read: membership is kept; host-b's lease expires (renewed at 20 s,
    // 3600 s) only an hour later, but host-d's lease was written with a short duration below.
    fake.set(
        "local",
        LEASES,
        lease_list(vec![
            lease("host-a", "1", Some("127.0.0.11:6443"), 30, hour),
            lease("host-b", "2", Some("127.0.0.12:6443"), 30, hour),
            lease("host-d", "1", None, 30, 15),
        ]),
    );
    let r = round(&mut s, &fake, 31_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    fake.set("local", LEASES, response(403, "application/json", b"{}"));
    let r = round(&mut s, &fake, 40_000);
    assert_eq!(r.error_kinds(), [("host-a", "http_status")]);
    let r = round(&mut s, &fake, 46_000);
    let t = r.publish.expect("host-d expired (renewed at 30 s for 15 s)").table;
    let names: Vec<&str> = t.servers.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["host-a", "host-b"]);
}

#[test]
fn lease_mode_before_the_first_lease_list_membership_is_unknown() {
    let mut s = Syncer::new(&Config::parse(LEASE_CONFIG.as_bytes()).expect("config"));
    let mut fake = lease_fake();
    fake.set("local", LEASES, Some(Outcome::Unreachable));
    let r = round(&mut s, &fake, 1000);
    let t = r.publish.expect("snapshot").table;
    assert!(t.membership_unknown);
    assert_eq!(t.servers.len(), 1);
    // Even a resource the local server alone serves is guarded: an unknown member may serve more.
    assert_eq!(
        route(&t, "GET", "/apis/nope.io/v1/things"),
        guarded(LocalReason::NotServedAnywhere, "nope.io", "v1", "things")
    );
    // A body that is not a lease list keeps it unknown too (and is counted).
    fake.set(
        "local",
        LEASES,
        response(200, "application/json", br#"{"kind":"Status"}"#),
    );
    let r = round(&mut s, &fake, 2000);
    assert_eq!(r.error_kinds(), [("host-a", "decode")]);
    // A list without this server's own lease (an unknown lease layout, or the wrong local_hostname)
    // may miss others too: still unknown, counted, and the log says what to check.
    fake.set(
        "local",
        LEASES,
        lease_list(vec![lease("host-b", "1", Some("127.0.0.12:6443"), 1, 3600)]),
    );
    let r = round(&mut s, &fake, 3000);
    assert_eq!(r.error_kinds(), [("host-a", "decode")]);
    let detail = &r.errors[0].detail;
    assert!(
        detail.contains("no identity lease of this server (hostname host-a)")
            && detail.contains("local_hostname")
            && detail.contains("the last membership is kept"),
        "{detail}"
    );
    assert!(r.publish.is_none(), "nothing changed: still unknown");
    // An empty list is no different: it does not list this server either.
    fake.set("local", LEASES, lease_list(vec![]));
    let r = round(&mut s, &fake, 4000);
    assert_eq!(r.error_kinds(), [("host-a", "decode")]);
    // Its own lease without the identity label value, or without a holder, is not valid: unknown.
    let mut unlabeled = lease("host-a", "1", None, 1, 3600);
    unlabeled["metadata"]["labels"]["apiserver.kubernetes.io/identity"] = "kube-apiserver-v2".into();
    let mut unheld = lease("host-a", "1", None, 1, 3600);
    unheld["spec"]["holderIdentity"] = "".into();
    fake.set("local", LEASES, lease_list(vec![unlabeled, unheld]));
    let r = round(&mut s, &fake, 5000);
    assert_eq!(r.error_kinds(), [("host-a", "decode")]);
    // Only its own lease: membership is known, and nobody else serves anything.
    fake.set("local", LEASES, lease_list(vec![lease("host-a", "1", None, 1, 3600)]));
    let r = round(&mut s, &fake, 6000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let t = r.publish.expect("membership known").table;
    assert!(!t.membership_unknown);
    assert_eq!(
        route(&t, "GET", "/apis/nope.io/v1/things"),
        Decision::Local(LocalReason::NotServedAnywhere)
    );
}

#[test]
fn lease_mode_a_list_without_this_servers_lease_keeps_the_last_good_membership() {
    let mut s = Syncer::new(&Config::parse(LEASE_CONFIG.as_bytes()).expect("config"));
    let mut fake = lease_fake();
    let hour = 3600;
    let good = || {
        lease_list(vec![
            lease("host-a", "1", Some("127.0.0.11:6443"), 1, hour),
            lease("host-b", "1", Some("127.0.0.12:6443"), 1, hour),
            lease("host-d", "1", None, 1, hour),
        ])
    };
    fake.set("local", LEASES, good());
    let r = round(&mut s, &fake, 1_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        names(&r.publish.expect("snapshot").table),
        ["host-a", "host-b", "host-d"]
    );
    // A future layout: this server's lease (and host-d's) under a label value the filter does not
    // know; host-b still readable. Not used: host-d stays a member, and it is counted.
    let mut relabeled = lease("host-a", "1", Some("127.0.0.11:6443"), 1, hour);
    relabeled["metadata"]["labels"]["apiserver.kubernetes.io/identity"] = "kube-apiserver-v2".into();
    fake.set(
        "local",
        LEASES,
        lease_list(vec![relabeled, lease("host-b", "1", Some("127.0.0.12:6443"), 1, hour)]),
    );
    for at in [2_000, 3_000] {
        let r = round(&mut s, &fake, at);
        assert_eq!(r.error_kinds(), [("host-a", "decode")]);
        assert!(
            r.errors[0]
                .detail
                .contains("no identity lease of this server (hostname host-a)"),
            "{}",
            r.errors[0].detail
        );
        assert_eq!(fetched_at(&r, "127.0.0.14:6443"), BTreeSet::from(["/api", "/apis"]));
        if let Some(p) = r.publish {
            assert_eq!(names(&p.table), ["host-a", "host-b", "host-d"]);
            assert!(!p.table.membership_unknown);
        }
    }
    // Its own lease back, host-d gone: applied at once.
    fake.set(
        "local",
        LEASES,
        lease_list(vec![
            lease("host-a", "1", Some("127.0.0.11:6443"), 1, hour),
            lease("host-b", "1", Some("127.0.0.12:6443"), 1, hour),
        ]),
    );
    let r = round(&mut s, &fake, 4_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(names(&r.publish.expect("snapshot").table), ["host-a", "host-b"]);
    // By address when no hostname is configured: its lease is recognised by its advertised address.
    let by_address = LEASE_CONFIG.replace(r#""local_hostname": "host-a""#, r#""local_address": "127.0.0.11:6443""#);
    let mut s = Syncer::new(&Config::parse(by_address.as_bytes()).expect("config"));
    fake.set(
        "local",
        LEASES,
        lease_list(vec![lease("host-b", "1", Some("127.0.0.12:6443"), 1, hour)]),
    );
    let r = round(&mut s, &fake, 1_000);
    assert_eq!(r.error_kinds(), [("host-a", "decode")]);
    assert!(
        r.errors[0].detail.contains("(address 127.0.0.11:6443)") && r.errors[0].detail.contains("local_address"),
        "{}",
        r.errors[0].detail
    );
    assert!(r.publish.expect("snapshot").table.membership_unknown);
    fake.set("local", LEASES, good());
    let r = round(&mut s, &fake, 2_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(!r.publish.expect("snapshot").table.membership_unknown);
}

/// A server that answers with the ETag of a document another server already sent gets that
/// document, shared, without a second parse (apiservers hash what they send; during an upgrade
/// most members send the same bytes). Shown by a body that would not even parse: only the ETag
/// lets it through. A round later, a new ETag is parsed as usual, and an undecodable body fails.
#[test]
fn a_document_with_another_servers_etag_is_shared_not_parsed() {
    let mut f = Fake::default();
    f.aggregated("local", "/api", core_doc(&["status"]));
    f.aggregated("local", "/apis", fixture(AGG_133));
    for peer in ["peer-b", "peer-c"] {
        f.aggregated(peer, "/api", core_doc(&["status"]));
    }
    f.aggregated("peer-b", "/apis", fixture(AGG_137));
    let b_etag = etag(&fixture(AGG_137));
    f.docs.insert(
        ("peer-c".into(), "/apis".into()),
        Doc {
            content_type: CONTENT_TYPE_V2.into(),
            body: b"not json".to_vec(),
            etag: Some(b_etag.clone()),
        },
    );
    let mut s = Syncer::new(&config());
    let r = round(&mut s, &f, 0);
    assert_eq!(
        r.error_kinds(),
        Vec::<(&str, &str)>::new(),
        "peer-c's /apis was shared, not parsed"
    );
    let t = r.publish.expect("snapshot").table;
    let claims = resource_key("resource.k8s.io", "v1", "resourceclaims");
    assert_eq!(t.keys.get(&claims).copied(), Some(0b110), "both new servers serve it");

    // The same bytes under an ETag nobody else has: parsed, and refused.
    f.docs.insert(
        ("peer-c".into(), "/apis".into()),
        Doc {
            content_type: CONTENT_TYPE_V2.into(),
            body: b"not json".to_vec(),
            etag: Some("\"other\"".into()),
        },
    );
    let r = round(&mut s, &f, 1500);
    assert_eq!(r.error_kinds(), vec![("peer-c", "decode")]);
}

#[test]
fn a_body_read_in_pieces_builds_the_same_snapshot_as_one_in_memory() {
    let whole = round(&mut Syncer::new(&config()), &fake(), 0)
        .publish
        .expect("snapshot");
    for piece in [1, 1000, 64 * 1024] {
        let mut f = fake();
        f.pieces = Some(piece);
        let r = round(&mut Syncer::new(&config()), &f, 0);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let p = r.publish.expect("snapshot");
        assert_eq!(p.table.fingerprint(), whole.table.fingerprint(), "pieces of {piece}");
        assert_eq!(p.merged_apis(), whole.merged_apis(), "pieces of {piece}");
    }
}

#[test]
fn a_body_that_cannot_be_read_to_its_end_is_a_decode_error_and_the_last_good_data_stays() {
    let mut s = Syncer::new(&config());
    let good = fake();
    let first = round(&mut s, &good, 0).publish.expect("snapshot");
    let mut bad = good.clone();
    let body = fixture(AGG_137);
    // A new document (another ETag, so it must be parsed), unreadable after its first 10 000 bytes.
    bad.set(
        "peer-b",
        "/apis",
        Some(Outcome::Response {
            status: 200,
            content_type: CONTENT_TYPE_V2.into(),
            etag: Some("\"other\"".into()),
            body: pieces(body, 4096, Some(10_000)),
        }),
    );
    let r = round(&mut s, &bad, 1000);
    assert_eq!(r.error_kinds(), [("peer-b", "decode")]);
    assert!(r.publish.is_none(), "peer-b keeps what it served: nothing changed");
    assert_eq!(
        route(
            &first.table,
            "GET",
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
        ),
        to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
    );
}

/// A newer aggregated discovery version than the filter reads (a future v3, if a server ever sent
/// one despite the Accept): a decode error that says so, not a legacy-parse error; the last good
/// data stays.
#[test]
fn an_unsupported_aggregated_discovery_version_is_a_decode_error_that_names_it() {
    let mut s = Syncer::new(&config());
    let good = fake();
    let first = round(&mut s, &good, 0).publish.expect("snapshot");
    let v3 = "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList";
    let body = String::from_utf8(fixture(AGG_137))
        .expect("utf-8")
        .replace("apidiscovery.k8s.io/v2", "apidiscovery.k8s.io/v3");
    let mut bad = good.clone();
    for path in ["/apis", "/api"] {
        bad.set("peer-b", path, response(200, v3, body.as_bytes()));
    }
    for at in [1000, 2000] {
        let r = round(&mut s, &bad, at);
        assert_eq!(r.error_kinds(), [("peer-b", "decode"), ("peer-b", "decode")]);
        for e in &r.errors {
            assert!(
                e.detail.contains("unsupported aggregated discovery version v3")
                    && e.detail.contains(v3)
                    && e.detail.contains("this filter reads v2 and v2beta1"),
                "{}",
                e.detail
            );
        }
        assert!(r.publish.is_none(), "peer-b keeps what it served: nothing changed");
    }
    assert_eq!(
        route(
            &first.table,
            "GET",
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
        ),
        to(PEER_B, "resource.k8s.io", "v1", "resourceclaims")
    );
    // v2beta1 and v2 are read; a legacy answer is not taken for a future version.
    for ct in [
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        CONTENT_TYPE_V2,
        "application/json",
        "application/json;g=apidiscovery.k8s.io;v=v3;as=Something",
    ] {
        assert_eq!(unsupported_aggregated_version(ct), None, "{ct}");
    }
    assert_eq!(
        unsupported_aggregated_version(
            "application/json; g=apidiscovery.k8s.io; v=v3; as=APIGroupDiscoveryList; profile=nopeer"
        ),
        Some("v3")
    );
}

// --- Membership from the EndpointSlice default/kubernetes -----------------------------------------

const SLICE_CONFIG: &str = r#"{
    "local_cluster": "local",
    "lease_discovery": {"source": "kubernetes_endpoints", "cluster": "peers-by-address",
                        "address_header": "x-kube-peer-proxy-peer-address", "local_address": "127.0.0.11:6443"},
    "refresh_interval": "1s",
    "fetch_timeout": "1s",
    "staleness_limit": "3s"
}"#;

const SLICE: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes";

/// The slice as kube-apiserver's lease endpoint reconciler writes it, with these IPs (port 6443).
fn endpoint_slice(ips: &[&str]) -> Option<Outcome> {
    let endpoints: Vec<serde_json::Value> = ips
        .iter()
        .map(|ip| serde_json::json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    let body = serde_json::json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": "kubernetes", "namespace": "default", "resourceVersion": "1",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": if endpoints.is_empty() { serde_json::Value::Null } else { endpoints.into() },
        "ports": [{"name": "https", "protocol": "TCP", "port": 6443}]
    });
    response(200, "application/json", body.to_string().as_bytes())
}

fn names(t: &Table) -> Vec<&str> {
    t.servers.iter().map(|x| x.name.as_str()).collect()
}

fn fetched_at<'a>(r: &'a Round, address: &str) -> BTreeSet<&'a str> {
    r.fetches
        .iter()
        .filter(|f| header(f, LEASE_ADDRESS_HEADER) == Some(address))
        .map(Fetch::path)
        .collect()
}

#[test]
fn endpoints_mode_members_join_leave_and_are_replaced_within_a_round() {
    let config = Config::parse(SLICE_CONFIG.as_bytes()).expect("config");
    assert_eq!(config.local_name, "127.0.0.11", "named by its IP, as the peers name it");
    let mut s = Syncer::new(&config);
    let mut fake = lease_fake();
    fake.set("local", SLICE, endpoint_slice(&["127.0.0.11", "127.0.0.12"]));
    let r = round(&mut s, &fake, 1_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let slice_fetch = r.fetches.iter().find(|f| f.path() == SLICE).expect("slice fetched");
    assert_eq!(slice_fetch.cluster, "local", "read through the local apiserver");
    assert_eq!(header(slice_fetch, "accept"), Some("application/json"));
    assert_eq!(header(slice_fetch, LEASE_ADDRESS_HEADER), None);
    assert!(
        r.fetches.iter().all(|f| f.path() != LEASES),
        "no identity lease list in this mode"
    );
    assert_eq!(
        fetched_at(&r, "127.0.0.12:6443"),
        BTreeSet::from(["/api", "/apis"]),
        "a new member is fetched in the round that found it"
    );
    assert!(
        fetched_at(&r, "127.0.0.11:6443").is_empty(),
        "never this server through the peer cluster"
    );
    let t = r.publish.expect("snapshot").table;
    assert_eq!(names(&t), ["127.0.0.11", "127.0.0.12"]);
    assert!(!t.membership_unknown);
    assert_eq!(t.servers[1].address.as_deref(), Some("127.0.0.12:6443"));
    assert_eq!(
        route(&t, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        to(1, "resource.k8s.io", "v1", "resourceclaims")
    );

    // Replaced: .12 leaves the slice, .14 joins; .14 is fetched and routed to in this round.
    fake.set("local", SLICE, endpoint_slice(&["127.0.0.11", "127.0.0.14"]));
    let r = round(&mut s, &fake, 2_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(fetched_at(&r, "127.0.0.14:6443"), BTreeSet::from(["/api", "/apis"]));
    let t = r.publish.expect("snapshot").table;
    assert_eq!(names(&t), ["127.0.0.11", "127.0.0.14"]);
    assert_eq!(t.known_groups, 0b11);
    assert_eq!(
        route(&t, "GET", "/apis/resource.k8s.io/v1/resourceclaims"),
        Decision::Local(LocalReason::NotServedAnywhere),
        "only the member that left served it"
    );

    // .14 leaves (graceful shutdown or an expired master lease): dropped when the round ends.
    fake.set("local", SLICE, endpoint_slice(&["127.0.0.11"]));
    let r = round(&mut s, &fake, 3_000);
    let t = r.publish.expect("snapshot").table;
    assert_eq!(names(&t), ["127.0.0.11"]);

    // A restart the slice shows as a leave and a join: a member that comes back starts unknown.
    fake.set("local", SLICE, endpoint_slice(&["127.0.0.11", "127.0.0.12"]));
    let r = round(&mut s, &fake, 4_000);
    assert_eq!(fetched_at(&r, "127.0.0.12:6443"), BTreeSet::from(["/api", "/apis"]));
    assert!(
        r.fetches
            .iter()
            .filter(|f| header(f, LEASE_ADDRESS_HEADER) == Some("127.0.0.12:6443"))
            .all(|f| header(f, "if-none-match").is_none()),
        "nothing of the old member's cache survives"
    );
    assert_eq!(names(&r.publish.expect("snapshot").table), ["127.0.0.11", "127.0.0.12"]);
}

#[test]
fn endpoints_mode_before_the_first_slice_membership_is_unknown() {
    let mut s = Syncer::new(&Config::parse(SLICE_CONFIG.as_bytes()).expect("config"));
    let mut fake = lease_fake();
    // No slice (--endpoint-reconciler-type=none): the fake's default answer is the apiserver's 404.
    let r = round(&mut s, &fake, 1_000);
    assert_eq!(r.error_kinds(), [("127.0.0.11", "http_status")]);
    let detail = &r.errors[0].detail;
    assert!(
        detail.contains("EndpointSlice default/kubernetes") && detail.contains("--endpoint-reconciler-type"),
        "the log says what to check: {detail}"
    );
    let t = r.publish.expect("snapshot").table;
    assert!(t.membership_unknown);
    assert_eq!(names(&t), ["127.0.0.11"]);
    // Even a resource nobody is known to serve is guarded: an unknown member may serve it.
    assert_eq!(
        route(&t, "GET", "/apis/nope.io/v1/things"),
        guarded(LocalReason::NotServedAnywhere, "nope.io", "v1", "things")
    );
    // Not the slice: still unknown (and counted).
    fake.set(
        "local",
        SLICE,
        response(200, "application/json", br#"{"kind":"Status","code":404}"#),
    );
    let r = round(&mut s, &fake, 2_000);
    assert_eq!(r.error_kinds(), [("127.0.0.11", "decode")]);
    assert!(r.publish.is_none(), "nothing changed: still unknown");
    // Forbidden: the message names the permission.
    fake.set("local", SLICE, response(403, "application/json", b"{}"));
    let r = round(&mut s, &fake, 3_000);
    assert_eq!(r.error_kinds(), [("127.0.0.11", "http_status")]);
    assert!(
        r.errors[0].detail.contains("get endpointslices"),
        "{}",
        r.errors[0].detail
    );
    // A slice that does not list this server: written from a view without it (up to one reconcile,
    // 10 s, after it started), or local_address is not its --advertise-address. It may miss others
    // too: still unknown, counted as decode, and the log says what to check.
    for (at, ips) in [(4_000, &[][..]), (5_000, &["127.0.0.12"][..])] {
        fake.set("local", SLICE, endpoint_slice(ips));
        let r = round(&mut s, &fake, at);
        assert_eq!(r.error_kinds(), [("127.0.0.11", "decode")], "{ips:?}");
        let detail = &r.errors[0].detail;
        assert!(
            detail.contains("EndpointSlice default/kubernetes does not list this server (127.0.0.11)")
                && detail.contains("--advertise-address")
                && detail.contains("the last membership is kept"),
            "{detail}"
        );
        assert!(r.publish.is_none(), "{ips:?}: nothing changed: still unknown");
    }
    // A slice with nobody else in it: membership is known, and only this server serves anything.
    fake.set("local", SLICE, endpoint_slice(&["127.0.0.11"]));
    let r = round(&mut s, &fake, 6_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let t = r.publish.expect("membership known").table;
    assert!(!t.membership_unknown);
    assert_eq!(
        route(&t, "GET", "/apis/nope.io/v1/things"),
        Decision::Local(LocalReason::NotServedAnywhere)
    );
    // Listed but not ready (shutting down, or a reconciler that marks it so) still counts as listed.
    let Some(Outcome::Response { body, .. }) = endpoint_slice(&["127.0.0.11"]) else {
        unreachable!()
    };
    let not_ready = String::from_utf8(body.to_vec())
        .expect("utf-8")
        .replace(r#""ready":true"#, r#""ready":false"#);
    assert!(not_ready.contains(r#""ready":false"#), "{not_ready}");
    fake.set("local", SLICE, response(200, "application/json", not_ready.as_bytes()));
    let r = round(&mut s, &fake, 7_000);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[test]
fn endpoints_mode_a_missing_or_malformed_slice_keeps_the_last_good_membership() {
    let mut s = Syncer::new(&Config::parse(SLICE_CONFIG.as_bytes()).expect("config"));
    let mut fake = lease_fake();
    fake.set(
        "local",
        SLICE,
        endpoint_slice(&["127.0.0.11", "127.0.0.12", "127.0.0.14"]),
    );
    let r = round(&mut s, &fake, 1_000);
    let good = r.publish.expect("snapshot").table;
    assert_eq!(names(&good), ["127.0.0.11", "127.0.0.12", "127.0.0.14"]);
    let bad_address = {
        let Some(Outcome::Response { body, .. }) = endpoint_slice(&["127.0.0.11", "127.0.0.12"]) else {
            unreachable!()
        };
        String::from_utf8(body.to_vec())
            .expect("utf-8")
            .replace("127.0.0.12", "cp-2")
    };
    let cases: Vec<(&str, Option<Outcome>, &str)> = vec![
        ("404", response(404, "application/json", br#"{"kind":"Status","code":404}"#), "http_status"),
        ("500", response(500, "application/json", b"{}"), "http_status"),
        ("unreachable", Some(Outcome::Unreachable), "unreachable"),
        ("not JSON", response(200, "application/json", b"<html>"), "decode"),
        (
            "another slice",
            response(
                200,
                "application/json",
                br#"{"kind":"EndpointSlice","metadata":{"name":"kubernetes-v6"},"addressType":"IPv6","endpoints":null}"#,
            ),
            "decode",
        ),
        ("a hostname in it", response(200, "application/json", bad_address.as_bytes()), "decode"),
        // Written from a view without this server: .14 missing from it says nothing of .14.
        ("without this server", endpoint_slice(&["127.0.0.12"]), "decode"),
    ];
    for (i, (desc, outcome, kind)) in cases.into_iter().enumerate() {
        fake.set("local", SLICE, outcome);
        let r = round(&mut s, &fake, 2_000 + 1_000 * i as u64);
        assert_eq!(r.error_kinds(), [("127.0.0.11", kind)], "{desc}");
        // Every member is still asked, and still a member.
        for peer in ["127.0.0.12:6443", "127.0.0.14:6443"] {
            assert_eq!(
                fetched_at(&r, peer),
                BTreeSet::from(["/api", "/apis"]),
                "{desc}: {peer}"
            );
        }
        if let Some(p) = r.publish {
            assert_eq!(names(&p.table), names(&good), "{desc}");
            assert!(!p.table.membership_unknown, "{desc}");
        }
    }
    // A good slice again applies at once.
    fake.set("local", SLICE, endpoint_slice(&["127.0.0.11", "127.0.0.14"]));
    let r = round(&mut s, &fake, 10_000);
    assert_eq!(names(&r.publish.expect("snapshot").table), ["127.0.0.11", "127.0.0.14"]);
}

/// peer-c's index with what its `APIGroupList` lacks: another member's autoregister controller
/// deleted the APIService `v1beta1.admissionregistration.k8s.io` (peer-c still serves it), the
/// remote `wardle.example/v1alpha1`, and `widgets.example.com/v1alpha1` (404: not served after all).
const PEER_C_INDEX_MORE: &str = r#"{"paths":{
  "api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=3"},
  "apis/apps/v1":{"serverRelativeURL":"/openapi/v3/apis/apps/v1?hash=5"},
  "apis/admissionregistration.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/admissionregistration.k8s.io/v1beta1?hash=9"},
  "apis/wardle.example/v1alpha1":{"serverRelativeURL":"/openapi/v3/apis/wardle.example/v1alpha1?hash=10"},
  "apis/widgets.example.com/v1":{"serverRelativeURL":"/openapi/v3/apis/widgets.example.com/v1?hash=6"},
  "apis/widgets.example.com/v1alpha1":{"serverRelativeURL":"/openapi/v3/apis/widgets.example.com/v1alpha1?hash=11"},
  "apis/widgets.example.com/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/widgets.example.com/v1beta1?hash=7"},
  "logs":{"serverRelativeURL":"/openapi/v3/logs?hash=12"}}}"#;

const VAP_V1BETA1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"admissionregistration.k8s.io/v1beta1","resources":[
  {"name":"validatingadmissionpolicies","singularName":"validatingadmissionpolicy","namespaced":false,"kind":"ValidatingAdmissionPolicy","verbs":["get","list"]},
  {"name":"validatingadmissionpolicies/status","singularName":"","namespaced":false,"kind":"ValidatingAdmissionPolicy","verbs":["get"]}]}"#;

const FLUNDERS: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"wardle.example/v1alpha1","resources":[
  {"name":"flunders","singularName":"flunder","namespaced":true,"kind":"Flunder","verbs":["get","list"]}]}"#;

fn fake_with_index() -> Fake {
    let mut f = fake();
    f.doc(
        "peer-c",
        "/openapi/v3",
        LEGACY_CT,
        PEER_C_INDEX_MORE.as_bytes().to_vec(),
        true,
    );
    f.doc(
        "peer-c",
        "/apis/admissionregistration.k8s.io/v1beta1",
        LEGACY_CT,
        VAP_V1BETA1.as_bytes().to_vec(),
        false,
    );
    f.doc(
        "peer-c",
        "/apis/wardle.example/v1alpha1",
        LEGACY_CT,
        FLUNDERS.as_bytes().to_vec(),
        true,
    );
    f
}

fn assert_index_walked(t: &Table) {
    let vap = resource_key("admissionregistration.k8s.io", "v1beta1", "validatingadmissionpolicies");
    assert_eq!(t.servers_for(&vap) & (1 << PEER_C), 1 << PEER_C, "peer-c serves it");
    assert_eq!(
        route(t, "GET", "/apis/wardle.example/v1alpha1/namespaces/a/flunders"),
        to(PEER_C, "wardle.example", "v1alpha1", "flunders")
    );
    assert!(!t.incomplete("admissionregistration.k8s.io", "v1beta1"));
    assert!(!t.incomplete("wardle.example", ""));
    assert!(
        !t.incomplete("widgets.example.com", "v1alpha1"),
        "a 404 is not served there, not unknown"
    );
    assert_eq!(
        route(t, "GET", "/apis/widgets.example.com/v1alpha1/widgets"),
        Decision::Local(LocalReason::NotServedAnywhere),
        "nobody serves it: a genuine 404"
    );
}

#[test]
fn group_versions_only_the_openapi_index_lists_are_walked() {
    let mut s = Syncer::new(&config());
    let fake = fake_with_index();
    let r = round(&mut s, &fake, 0);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let paths = r.paths("peer-c");
    for p in [
        "/openapi/v3",
        "/apis/admissionregistration.k8s.io/v1beta1",
        "/apis/wardle.example/v1alpha1",
        "/apis/widgets.example.com/v1alpha1",
    ] {
        assert!(paths.contains(p), "{p}: {paths:?}");
    }
    assert!(
        !r.paths("peer-b").contains("/openapi/v3"),
        "aggregated servers need no index"
    );
    assert!(!r.paths("local").contains("/openapi/v3"));
    let index = r
        .fetches
        .iter()
        .find(|f| f.cluster == "peer-c" && f.path() == "/openapi/v3")
        .expect("index fetch");
    assert_eq!(header(index, PEER_PROXIED_HEADER), Some("true"));
    assert_eq!(header(index, "authorization"), Some("Bearer t0ken"));
    assert_eq!(header(index, ":authority"), Some("kube.example"));
    let p = r.publish.expect("snapshot");
    assert_index_walked(&p.table);
    // The index's versions join their group: one widgets group, its versions in walk order.
    let merged = parse_aggregated(&p.merged_apis()).expect("merged");
    let widgets: Vec<_> = merged
        .items
        .iter()
        .filter(|g| g.metadata.name == "widgets.example.com")
        .collect();
    assert_eq!(widgets.len(), 1);

    // Next round the index is a 304 (its ETag is sent): the same walk, nothing changes.
    let again = round(&mut s, &fake, 1000);
    assert!(again.errors.is_empty(), "{:?}", again.errors);
    let index = again
        .fetches
        .iter()
        .find(|f| f.cluster == "peer-c" && f.path() == "/openapi/v3")
        .expect("index fetch");
    assert!(header(index, "if-none-match").is_some());
    assert!(again.paths("peer-c").contains("/apis/wardle.example/v1alpha1"));
    assert!(again.publish.is_none(), "unchanged");
}

#[test]
fn without_an_openapi_index_the_group_list_alone_is_walked() {
    let mut s = Syncer::new(&config());
    let mut fake = fake_with_index();
    for (status, body) in [
        (404, &b"404 page not found\n"[..]),
        (403, br#"{"kind":"Status","code":403}"#),
    ] {
        fake.set("peer-c", "/openapi/v3", response(status, "application/json", body));
        let r = round(&mut s, &fake, 0);
        assert_eq!(r.error_kinds(), [("peer-c", "http_status")], "{status}");
        assert!(!r.paths("peer-c").contains("/apis/wardle.example/v1alpha1"));
        let t = r.publish.expect("snapshot").table;
        assert_eq!(
            route(&t, "GET", "/apis/widgets.example.com/v1beta1/gadgets"),
            to(PEER_C, "widgets.example.com", "v1beta1", "gadgets")
        );
        assert_eq!(
            route(&t, "GET", "/apis/wardle.example/v1alpha1/namespaces/a/flunders"),
            Decision::Local(LocalReason::NotServedAnywhere)
        );
        s = Syncer::new(&config());
    }
}

#[test]
fn a_malformed_or_failed_openapi_index_keeps_the_last_good_one() {
    let mut s = Syncer::new(&config());
    let good = fake_with_index();
    let first = round(&mut s, &good, 0);
    assert!(first.errors.is_empty(), "{:?}", first.errors);
    let mut now = 0;
    for (outcome, kind) in [
        (response(200, "application/json", b"{\"paths\":"), "decode"),
        (response(200, "application/json", b"[]"), "decode"),
        (response(404, "text/plain", b"404 page not found\n"), "http_status"),
        (Some(Outcome::NoResponse), "reset"),
    ] {
        now += 1000;
        let mut bad = good.clone();
        bad.set("peer-c", "/openapi/v3", outcome);
        let r = round(&mut s, &bad, now);
        assert_eq!(r.error_kinds(), [("peer-c", kind)]);
        assert!(
            r.paths("peer-c").contains("/apis/wardle.example/v1alpha1"),
            "the last good index is followed"
        );
        assert!(r.publish.is_none(), "nothing lost: no change ({kind})");
    }
    assert_index_walked(&first.publish.expect("snapshot").table);
}

#[test]
fn a_listed_group_version_that_answers_404_is_not_served_not_unknown() {
    // The APIGroupList follows the shared APIService objects: it may list what this server does
    // not serve (another member's autoregister controller created the APIService).
    let mut s = Syncer::new(&config());
    let mut fake = fake();
    fake.docs
        .remove(&("peer-c".to_string(), "/apis/widgets.example.com/v1beta1".to_string()));
    let r = round(&mut s, &fake, 0);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let t = r.publish.expect("snapshot").table;
    assert!(!t.incomplete("widgets.example.com", "v1beta1"));
    assert_eq!(
        route(&t, "GET", "/apis/widgets.example.com/v1beta1/gadgets"),
        Decision::Local(LocalReason::NotServedAnywhere)
    );
    assert_eq!(
        route(&t, "GET", "/apis/widgets.example.com/v1/widgets"),
        to(PEER_C, "widgets.example.com", "v1", "widgets")
    );
}

// --- The local server's readiness probe (discovery::sync::local_ready) ----------------------------

fn readyz(status: u16) -> Outcome {
    Outcome::Response {
        status,
        content_type: "text/plain".into(),
        etag: None,
        body: Body::Bytes(Vec::new()),
    }
}

/// The probe a tick at `now` sends (it must send one).
fn probe_at(s: &mut Syncer, now: u64) -> (Fetch, kube_peer_proxy::discovery::sync::Step) {
    let mut step = s.on_tick(now);
    let probe = step.probe.take().expect("a readiness probe");
    (probe, step)
}

#[test]
fn the_local_server_is_probed_every_tick_and_not_ready_reroutes_at_once() {
    let mut s = Syncer::new(&config());
    let good = fake();
    let first = round(&mut s, &good, 0).publish.expect("snapshot");
    // Served by local and peer-b alike: local while it is ready.
    let pods = "/api/v1/namespaces/default/pods";
    assert!(matches!(
        route(&first.table, "GET", pods),
        Decision::Local(_) | Decision::Guarded { .. }
    ));

    // Every tick probes, within the rounds' schedule or not (refresh_interval is 1 s here).
    let (p, step) = probe_at(&mut s, 250);
    assert!(step.fetches.is_empty(), "no round is due at 250 ms");
    assert_eq!((p.cluster.as_str(), p.path()), ("local", "/readyz"));
    assert_eq!(header(&p, ":method"), Some("GET"));
    assert_eq!(
        header(&p, "authorization"),
        Some("Bearer t0ken"),
        "the discovery headers go with it"
    );
    assert!(p.timeout_ms <= 1000, "a hung server is noticed within about a tick");
    // Ready: nothing to publish.
    assert!(s.on_response(p.id, readyz(200), 250).publish.is_none());
    assert!(s.local_ready());

    // Not ready: published at once with the local server unhealthy, so pods go to peer-b.
    let (p, _) = probe_at(&mut s, 500);
    let down = s
        .on_response(p.id, Outcome::Unreachable, 500)
        .publish
        .expect("published at once");
    assert!(!s.local_ready());
    assert_eq!(down.table.unhealthy, 1, "the local server (bit 0) is not routed to");
    assert_eq!(down.table.keys, first.table.keys, "what everybody serves is unchanged");
    assert_eq!(route(&down.table, "GET", pods), to(PEER_B, "", "v1", "pods"));
    // (What only the local server serves still goes there: tests/routing.rs, "local server
    // unreachable, nobody else serves it".)
    // Still not ready: nothing new.
    let (p, _) = probe_at(&mut s, 750);
    assert!(s.on_response(p.id, readyz(503), 750).publish.is_none());

    // Ready again: published at once, and the next tick starts a round (its discovery may be
    // another version's now) before the refresh interval is due.
    let mut unready = good.clone();
    unready.set("local", "/readyz", Some(readyz(503)));
    let r = round(&mut s, &unready, 1000);
    assert!(
        r.publish.is_none(),
        "the round at 1 s: nothing changed while the local server is down"
    );
    let (p, _) = probe_at(&mut s, 1250);
    let up = s
        .on_response(p.id, readyz(200), 1250)
        .publish
        .expect("published at once");
    assert_eq!(up.table.unhealthy, 0);
    assert!(matches!(
        route(&up.table, "GET", pods),
        Decision::Local(_) | Decision::Guarded { .. }
    ));
    let next = s.on_tick(1300);
    assert!(
        next.fetches.iter().any(|f| f.cluster == "local" && f.path() == "/apis"),
        "a round starts at once: {:?}",
        next.fetches.iter().map(Fetch::path).collect::<Vec<_>>()
    );
}

#[test]
fn what_the_probe_counts_as_ready() {
    let rows: [(&str, Outcome, bool); 9] = [
        ("200", readyz(200), true),
        // A starting kube-apiserver refuses every request until its authorizer has synced (the real
        // node: "ready again" on a 403, then /readyz 500 0.14 s later): only a 200 is ready.
        ("401", readyz(401), false),
        ("403 (the authorizer has not synced)", readyz(403), false),
        ("404", readyz(404), false),
        ("500 (a failed check)", readyz(500), false),
        ("503 (starting, or shutting down)", readyz(503), false),
        ("cannot connect", Outcome::Unreachable, false),
        ("reset", Outcome::NoResponse, false),
        ("no answer in time", Outcome::Overdue, false),
    ];
    for (desc, outcome, ready) in rows {
        let mut s = Syncer::new(&config());
        round(&mut s, &fake(), 0);
        let (p, _) = probe_at(&mut s, 250);
        let step = s.on_response(p.id, outcome, 250);
        assert_eq!(s.local_ready(), ready, "{desc}");
        assert_eq!(
            step.publish.is_some(),
            !ready,
            "{desc}: a change is published, no change is not"
        );
        assert!(step.errors.is_empty(), "{desc}: the probe is not a discovery error");
    }
}

#[test]
fn one_probe_at_a_time_and_a_lost_one_is_forgotten() {
    let mut s = Syncer::new(&config());
    round(&mut s, &fake(), 0);
    let (p, _) = probe_at(&mut s, 100);
    // Unanswered: no second probe on the next ticks...
    for now in [200, 1000, 2000] {
        assert!(s.on_tick(now).probe.is_none(), "a second probe at {now} ms");
    }
    // ...until three timeouts have passed (the host always answers; this only guards the state).
    let (again, _) = probe_at(&mut s, 3100);
    assert_ne!(again.id, p.id);
    // A late answer to the forgotten probe changes nothing.
    assert!(s.on_response(p.id, Outcome::Unreachable, 3150).publish.is_none());
    assert!(s.local_ready());
    assert!(s.on_response(again.id, Outcome::Unreachable, 3200).publish.is_some());
    assert!(!s.local_ready());
}
