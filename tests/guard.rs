//! The 404 guard's pure parts: what is asked, how an answer reads, and the verdict.
#![cfg(test)]

mod common;

use common::{group, res, ver};
use kube_peer_proxy::request::guard::{first_look, listed, question, verdict, First, Question, Verdict};
use kube_peer_proxy::request::routing::Gvr;
use kube_peer_proxy::snapshot::{ServerDiscovery, ServerRef, Table};

fn table() -> Table {
    let d = ServerDiscovery {
        core: vec![group("", vec![ver("v1", vec![res("pods", &["status", "resize"])])])],
        groups: Vec::new(),
    };
    let s = ServerRef {
        name: "a".into(),
        cluster: "local".into(),
        local: true,
        address: None,
    };
    Table::build(&[(s, &d)])
}

fn q(path: &str, name: Option<&str>, g: &str, v: &str, r: &str) -> Question {
    Question {
        path: path.into(),
        name: name.map(str::to_string),
        gvr: Gvr {
            group: g.to_string().into(),
            version: v.to_string().into(),
            resource: r.to_string().into(),
        },
    }
}

#[test]
fn questions() {
    let t = table();
    let rows: [(&str, &str, Option<Question>); 9] = [
        (
            "GET",
            "/api/v1/namespaces/a/pods/p",
            Some(q("/api/v1", Some("pods"), "", "v1", "pods")),
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/pods/p/resize",
            Some(q("/api/v1", Some("pods/resize"), "", "v1", "pods")),
        ),
        // A subresource nobody is known to serve was routed on its parent: ask about the parent.
        (
            "GET",
            "/api/v1/namespaces/a/pods/p/bogus",
            Some(q("/api/v1", Some("pods"), "", "v1", "pods")),
        ),
        (
            "GET",
            "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
            Some(q(
                "/apis/admissionregistration.k8s.io/v1",
                Some("mutatingadmissionpolicies"),
                "admissionregistration.k8s.io",
                "v1",
                "mutatingadmissionpolicies",
            )),
        ),
        (
            "GET",
            "/apis/batch/v1",
            Some(q("/apis/batch/v1", None, "batch", "v1", "")),
        ),
        ("GET", "/apis/batch", Some(q("/apis/batch", None, "batch", "", ""))),
        ("GET", "/api/v2", Some(q("/api/v2", None, "", "v2", ""))),
        ("GET", "/healthz", None),
        ("GET", "/apis", None),
    ];
    for (method, path, want) in rows {
        assert_eq!(question(method, path, Some(&t)), want, "{path}");
    }
    // While some member's API set is unknown, that member may serve the subresource: ask about it.
    let mut incomplete = t.clone();
    incomplete.membership_unknown = true;
    assert_eq!(
        question("GET", "/api/v1/namespaces/a/pods/p/bogus", Some(&incomplete)).and_then(|q| q.name),
        Some("pods/bogus".to_string())
    );
    // Without a table every subresource is asked about as such.
    assert_eq!(
        question("GET", "/api/v1/namespaces/a/pods/p/bogus", None).and_then(|q| q.name),
        Some("pods/bogus".to_string())
    );
}

#[test]
fn first_look_at_a_404() {
    let res = q("/api/v1", Some("pods"), "", "v1", "pods");
    let disc = q("/apis/batch/v1", None, "batch", "v1", "");
    assert_eq!(first_look("text/plain; charset=utf-8", &res), First::TypeNotServed);
    assert_eq!(first_look("application/json", &res), First::AskServer);
    assert_eq!(
        first_look("application/vnd.kubernetes.protobuf", &res),
        First::AskServer
    );
    assert_eq!(first_look("application/yaml", &res), First::AskServer);
    assert_eq!(first_look("", &res), First::AskServer);
    assert_eq!(first_look("application/json", &disc), First::TypeNotServed);
}

#[test]
fn answers() {
    let list = br#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"v1","resources":[
        {"name":"pods","namespaced":true,"kind":"Pod","verbs":["get"]},
        {"name":"pods/status","namespaced":true,"kind":"Pod","verbs":["get"]}]}"#;
    let pods = q("/api/v1", Some("pods"), "", "v1", "pods");
    let resize = q("/api/v1", Some("pods/resize"), "", "v1", "pods");
    let disc = q("/apis/batch/v1", None, "batch", "v1", "");
    assert_eq!(listed(&pods, 200, list), Some(true));
    assert_eq!(listed(&resize, 200, list), Some(false));
    assert_eq!(listed(&pods, 404, b"404 page not found\n"), Some(false));
    assert_eq!(listed(&pods, 200, b"{not json"), None);
    assert_eq!(listed(&pods, 200, br#"{"kind":"Status"}"#), None);
    assert_eq!(
        listed(&pods, 503, b""),
        None,
        "Envoy's connect failure: cannot be asked"
    );
    assert_eq!(listed(&pods, 0, b""), None);
    assert_eq!(listed(&pods, 401, b""), None);
    assert_eq!(listed(&disc, 200, b"anything"), Some(true));
    assert_eq!(listed(&disc, 404, b""), Some(false));
}

/// (the answering server's answer, last seen to serve it there, strict, the other members' answers, verdict, why)
type VerdictRow = (Option<bool>, bool, bool, &'static [Option<bool>], Verdict, &'static str);

#[test]
fn verdicts() {
    use Verdict::*;
    #[rustfmt::skip]
    let rows: [VerdictRow; 12] = [
        (Some(true), false, true, &[], Stand, "the answering server serves the type: an object's 404"),
        (Some(true), false, false, &[Some(true)], Stand, "an object's 404 stands whatever others say"),
        (Some(false), true, true, &[], Unavailable, "strict: a type-404 might be false, whatever the table said"),
        (None, false, false, &[], Unavailable, "the answering server cannot say and was not seen to serve it"),
        (None, true, true, &[], Stand, "cannot be asked (e.g. discovery refused) but last seen to serve it: an object's 404"),
        (None, true, false, &[Some(true)], Stand, "same, in verified mode"),
        (Some(false), true, false, &[], Stand, "its discovery says now it does not serve it (the table is old), nobody else does"),
        (Some(false), false, false, &[], Stand, "nobody else is a member: genuine"),
        (Some(false), false, false, &[Some(false), Some(false)], Stand, "nobody serves it now: genuine"),
        (Some(false), false, false, &[None, Some(false)], Stand, "a member that cannot be asked counts as last seen"),
        (Some(false), false, false, &[Some(false), Some(true)], Unavailable, "a member serves it now"),
        (Some(false), false, false, &[Some(true), None], Unavailable, "a member serves it now"),
    ];
    for (answering, last_seen, strict, others, want, why) in rows {
        assert_eq!(verdict(answering, last_seen, strict, others), want, "{why}");
    }
}

#[test]
fn table_keys_of_questions() {
    use kube_peer_proxy::snapshot::{group_key, resource_key, subresource_key, version_key};
    assert_eq!(
        q("/api/v1", Some("pods"), "", "v1", "pods").table_key(),
        resource_key("", "v1", "pods")
    );
    assert_eq!(
        q("/api/v1", Some("pods/resize"), "", "v1", "pods").table_key(),
        subresource_key("", "v1", "pods", "resize")
    );
    assert_eq!(
        q("/apis/batch/v1", None, "batch", "v1", "").table_key(),
        version_key("batch", "v1")
    );
    assert_eq!(q("/apis/batch", None, "batch", "", "").table_key(), group_key("batch"));
}

// The conversation, played the way the filter plays it: every call asked for is made, and its
// answer is fed back, in every order the answers could arrive in.

use kube_peer_proxy::config::Config;
use kube_peer_proxy::request::guard::{Call, Conversation, Step, Target, MAX_ASKED};
use kube_peer_proxy::request::routing::{Guard, Kind, Mode, Subject};

/// What a server's discovery says when asked about `x.io/v1`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Says {
    /// 200, lists `widgets`.
    Lists,
    /// 200, lists only `gadgets`.
    Lacks,
    /// 404: it does not serve `x.io/v1` at all.
    NoSuchVersion,
    /// No response (timeout, reset, a call that could not be made): status 0.
    Silent,
    /// Envoy's 503: cannot connect.
    Unreachable,
    /// 401: the discovery credential is refused.
    Refused,
}

fn says(s: Says) -> (u16, Vec<u8>) {
    let list = |names: &[&str]| {
        let resources: Vec<String> = names
            .iter()
            .map(|n| format!(r#"{{"name":"{n}","namespaced":true,"kind":"K","verbs":["get"]}}"#))
            .collect();
        let body = format!(
            r#"{{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"x.io/v1","resources":[{}]}}"#,
            resources.join(",")
        );
        (200, body.into_bytes())
    };
    match s {
        Says::Lists => list(&["widgets", "gadgets"]),
        Says::Lacks => list(&["gadgets"]),
        Says::NoSuchVersion => (404, b"404 page not found\n".to_vec()),
        Says::Silent => (0, Vec::new()),
        Says::Unreachable => (503, b"upstream connect error".to_vec()),
        Says::Refused => (401, Vec::new()),
    }
}

fn server(name: &str, local: bool, address: Option<&str>) -> ServerRef {
    ServerRef {
        name: name.into(),
        cluster: if address.is_some() { "lease".into() } else { name.into() },
        local,
        address: address.map(str::to_string),
    }
}

/// `local` and `peers` peers b, c, ...; the local server was last seen to serve `widgets` iff
/// `local_serves`; every peer serves only `gadgets` (so nobody else is known to serve widgets).
fn members(peers: usize, local_serves: bool) -> Table {
    let x = |names: &[&str]| ServerDiscovery {
        core: Vec::new(),
        groups: vec![group(
            "x.io",
            vec![ver("v1", names.iter().map(|n| res(n, &[])).collect())],
        )],
    };
    let (served, other) = (x(&["widgets", "gadgets"]), x(&["gadgets"]));
    let mut servers = vec![(server("local", true, None), if local_serves { &served } else { &other })];
    for i in 0..peers {
        let name = format!("peer{i}");
        servers.push((server(&name, false, None), &other));
    }
    Table::build(&servers)
}

fn widgets(mode: Mode) -> Guard<'static> {
    Guard {
        mode,
        subject: Subject {
            gvr: Gvr {
                group: "x.io".into(),
                version: "v1".into(),
                resource: "widgets".into(),
            },
            subresource: "".into(),
            kind: Kind::Resource,
        },
    }
}

fn target(cluster: &str, address: Option<&str>) -> Target {
    Target {
        cluster: cluster.into(),
        address: address.map(str::to_string),
    }
}

/// A verdict and who was asked (sorted), for one order of the answers.
type Outcome = (Verdict, Vec<String>);

/// Every outcome over every order the outstanding answers can arrive in (with more than four
/// outstanding, first-asked-first-answered only). A verdict never leaves a call unanswered.
fn explore(
    c: &Conversation,
    step: Step,
    mut waiting: Vec<Call>,
    mut asked: Vec<String>,
    table: &Table,
    answer: &dyn Fn(&Target) -> Says,
    out: &mut Vec<Outcome>,
) {
    match step {
        Step::Verdict(v) => {
            assert!(waiting.is_empty(), "a verdict before every answer is in: {waiting:?}");
            asked.sort();
            out.push((v, asked));
            return;
        }
        Step::Ask(calls) => {
            assert!(!calls.is_empty(), "an empty Ask");
            for call in calls {
                assert_eq!(call.path, "/apis/x.io/v1");
                asked.push(
                    call.target
                        .address
                        .clone()
                        .unwrap_or_else(|| call.target.cluster.clone()),
                );
                waiting.push(call);
            }
        }
        Step::Wait => assert!(!waiting.is_empty(), "waits with nothing asked"),
    }
    let orders = if waiting.len() > 4 { 1 } else { waiting.len() };
    for i in 0..orders {
        let (mut c, mut waiting) = (c.clone(), waiting.clone());
        let call = waiting.remove(i);
        let (status, body) = says(answer(&call.target));
        let next = c.on_answer(call.id, status, &body, Some(table));
        explore(&c, next, waiting, asked.clone(), table, answer, out);
    }
}

/// Plays a 404 with `content_type` from `by`; returns the one outcome every order gives.
fn play(guard: &Guard, by: Target, content_type: &str, table: &Table, answer: &dyn Fn(&Target) -> Says) -> Outcome {
    let (c, step) = Conversation::start(guard, by, content_type, Some(table));
    let mut out = Vec::new();
    explore(&c, step, Vec::new(), Vec::new(), table, answer, &mut out);
    let first = out.first().cloned().expect("an outcome");
    assert!(
        out.iter().all(|o| *o == first),
        "the order of the answers changed the outcome: {out:?}"
    );
    first
}

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// (why, mode, 404 content type, the local server last seen to serve widgets, what local/peer0/peer1 say, verdict, asked)
type ConversationRow = (
    &'static str,
    Mode,
    &'static str,
    bool,
    [Says; 3],
    Verdict,
    &'static [&'static str],
);

#[test]
fn conversations() {
    use Mode::{Strict, Verified};
    use Says::*;
    use Verdict::{Stand, Unavailable};
    #[rustfmt::skip]
    let rows: [ConversationRow; 20] = [
        // Strict: a type-404 is a 503 without asking anyone else.
        ("strict, type 404 from the headers", Strict, TEXT, true, [Lists, Lists, Lists], Unavailable, &[]),
        ("strict, an object's 404 (its discovery lists the type)", Strict, JSON, false, [Lists, Lists, Lists], Stand, &["local"]),
        ("strict, go-restful's type 404 (its discovery lacks it)", Strict, JSON, true, [Lacks, Lacks, Lacks], Unavailable, &["local"]),
        ("strict, the answering server cannot be asked, last seen to serve it", Strict, JSON, true, [Silent, Lists, Lists], Stand, &["local"]),
        ("strict, the answering server cannot be asked, not last seen to serve it", Strict, JSON, false, [Silent, Lists, Lists], Unavailable, &["local"]),
        // Verified, an object's 404 against a type 404.
        ("verified, an object's 404 costs one question", Verified, JSON, true, [Lists, Lists, Lists], Stand, &["local"]),
        ("verified, type 404 from the headers, nobody serves it now", Verified, TEXT, false, [Lists, Lacks, NoSuchVersion], Stand, &["peer0", "peer1"]),
        ("verified, type 404 from the headers, a member serves it now", Verified, TEXT, false, [Lacks, Lacks, Lists], Unavailable, &["peer0", "peer1"]),
        ("verified, go-restful's type 404, nobody serves it now", Verified, JSON, true, [Lacks, Lacks, Lacks], Stand, &["local", "peer0", "peer1"]),
        ("verified, go-restful's type 404, a member serves it now", Verified, JSON, true, [Lacks, Lists, Lacks], Unavailable, &["local", "peer0", "peer1"]),
        ("verified, its group/version is not served there", Verified, JSON, false, [NoSuchVersion, Lists, Lacks], Unavailable, &["local", "peer0", "peer1"]),
        // A member that does not answer counts with what it was last seen to serve (not widgets).
        ("verified, a member times out, nobody else serves it", Verified, TEXT, false, [Lacks, Silent, Lacks], Stand, &["peer0", "peer1"]),
        ("verified, a member is unreachable, nobody else serves it", Verified, TEXT, false, [Lacks, Unreachable, Refused], Stand, &["peer0", "peer1"]),
        ("verified, a member times out, another serves it now", Verified, TEXT, false, [Lacks, Silent, Lists], Unavailable, &["peer0", "peer1"]),
        // last_seen: the answering server's discovery cannot be asked.
        ("verified, cannot be asked, last seen to serve it: an object's 404", Verified, JSON, true, [Silent, Lists, Lists], Stand, &["local"]),
        ("verified, credential refused, last seen to serve it", Verified, JSON, true, [Refused, Lists, Lists], Stand, &["local"]),
        ("verified, cannot be asked, not last seen to serve it", Verified, JSON, false, [Unreachable, Lacks, Lacks], Unavailable, &["local"]),
        ("verified, its discovery now lacks what the table said (the table is old)", Verified, JSON, true, [Lacks, Lacks, Lacks], Stand, &["local", "peer0", "peer1"]),
        // A text/plain 404 says "not served" whatever the table said: others are asked.
        ("verified, type 404 from the headers although last seen to serve it", Verified, TEXT, true, [Lists, Lacks, Lacks], Stand, &["peer0", "peer1"]),
        ("verified, type 404 from the headers although last seen, a member serves it", Verified, TEXT, true, [Lists, Lists, Silent], Unavailable, &["peer0", "peer1"]),
    ];
    for (why, mode, content_type, local_serves, answers, want, want_asked) in rows {
        let table = members(2, local_serves);
        let answer = |t: &Target| match t.cluster.as_str() {
            "local" => answers[0],
            "peer0" => answers[1],
            _ => answers[2],
        };
        let (verdict, asked) = play(&widgets(mode), target("local", None), content_type, &table, &answer);
        assert_eq!(verdict, want, "{why}");
        assert_eq!(asked, want_asked.to_vec(), "{why}");
    }
}

#[test]
fn the_ask_limit() {
    let none_serve = |_: &Target| Says::Lacks;
    // Up to MAX_ASKED other members are asked; with more, a type-404 is a 503 without asking.
    for (others, content_type, want, asked) in [
        (MAX_ASKED, TEXT, Verdict::Stand, MAX_ASKED),
        (MAX_ASKED + 1, TEXT, Verdict::Unavailable, 0),
        (MAX_ASKED, JSON, Verdict::Stand, MAX_ASKED + 1),
        (MAX_ASKED + 1, JSON, Verdict::Unavailable, 1),
    ] {
        let table = members(others, false);
        let (verdict, who) = play(
            &widgets(Mode::Verified),
            target("local", None),
            content_type,
            &table,
            &none_serve,
        );
        assert_eq!((verdict, who.len()), (want, asked), "{others} others, {content_type}");
    }
    // An object's 404 asks only the answering server, however many members there are.
    let table = members(MAX_ASKED + 1, true);
    let (verdict, who) = play(&widgets(Mode::Verified), target("local", None), JSON, &table, &|_| {
        Says::Lists
    });
    assert_eq!((verdict, who), (Verdict::Stand, vec!["local".to_string()]));
    // No other member: a type-404 stands at once.
    let (c, step) = Conversation::start(
        &widgets(Mode::Verified),
        target("local", None),
        TEXT,
        Some(&members(0, false)),
    );
    assert_eq!(step, Step::Verdict(Verdict::Stand));
    assert_eq!(c.question().path, "/apis/x.io/v1");
}

#[test]
fn last_seen_is_the_answering_servers_own() {
    // Two lease peers behind one cluster, told apart by address: only .12 was seen to serve widgets.
    let x = |names: &[&str]| ServerDiscovery {
        core: Vec::new(),
        groups: vec![group(
            "x.io",
            vec![ver("v1", names.iter().map(|n| res(n, &[])).collect())],
        )],
    };
    let (served, other) = (x(&["widgets"]), x(&["gadgets"]));
    let table = Table::build(&[
        (server("local", true, None), &other),
        (server("b", false, Some("127.0.0.11:6443")), &other),
        (server("c", false, Some("127.0.0.12:6443")), &served),
    ]);
    let silent = |_: &Target| Says::Silent;
    for (address, want) in [
        ("127.0.0.12:6443", Verdict::Stand),
        ("127.0.0.11:6443", Verdict::Unavailable),
    ] {
        let (verdict, asked) = play(
            &widgets(Mode::Strict),
            target("lease", Some(address)),
            JSON,
            &table,
            &silent,
        );
        assert_eq!(verdict, want, "{address}");
        assert_eq!(
            asked,
            vec![address.to_string()],
            "the answering server is the one asked"
        );
    }
    // Without a table nothing was seen: a 404 nobody can vouch for is a 503.
    let (c, step) = Conversation::start(&widgets(Mode::Strict), target("local", None), JSON, None);
    let mut c = c;
    let Step::Ask(calls) = step else {
        panic!("asks the answering server")
    };
    assert_eq!(calls.len(), 1);
    assert_eq!(c.on_answer(0, 0, b"", None), Step::Verdict(Verdict::Unavailable));
}

#[test]
fn answers_that_do_not_belong() {
    let table = members(2, false);
    let (mut c, step) = Conversation::start(&widgets(Mode::Verified), target("local", None), TEXT, Some(&table));
    let Step::Ask(calls) = step else {
        panic!("asks the others")
    };
    let ids: Vec<usize> = calls.iter().map(|c| c.id).collect();
    assert_eq!(ids, vec![1, 2]);
    let (lists, lacks) = (says(Says::Lists), says(Says::Lacks));
    // An id never asked, and the answering server (its 404 already said "not served"): ignored.
    assert_eq!(c.on_answer(7, lists.0, &lists.1, Some(&table)), Step::Wait);
    assert_eq!(c.on_answer(0, lists.0, &lists.1, Some(&table)), Step::Wait);
    assert_eq!(c.on_answer(2, lacks.0, &lacks.1, Some(&table)), Step::Wait);
    // A repeated answer does not count twice nor change the first.
    assert_eq!(c.on_answer(2, lists.0, &lists.1, Some(&table)), Step::Wait);
    assert_eq!(
        c.on_answer(1, lacks.0, &lacks.1, Some(&table)),
        Step::Verdict(Verdict::Stand)
    );
}

#[test]
fn a_document_404_is_about_the_type() {
    // GET /apis/x.io/v1: any 404 says the group/version is not served there; a member whose
    // discovery answers 200 serves it now.
    let guard = Guard {
        mode: Mode::Verified,
        subject: Subject {
            gvr: Gvr {
                group: "x.io".into(),
                version: "v1".into(),
                resource: "".into(),
            },
            subresource: "".into(),
            kind: Kind::Document,
        },
    };
    let table = members(2, false);
    let one_serves = |t: &Target| {
        if t.cluster == "peer1" {
            Says::Lacks
        } else {
            Says::NoSuchVersion
        }
    };
    let (verdict, asked) = play(&guard, target("local", None), JSON, &table, &one_serves);
    assert_eq!(
        (verdict, asked),
        (Verdict::Unavailable, vec!["peer0".to_string(), "peer1".to_string()])
    );
    let (verdict, _) = play(&guard, target("local", None), JSON, &table, &|_| Says::NoSuchVersion);
    assert_eq!(verdict, Verdict::Stand);
}

#[test]
fn calls_are_discovery_gets_marked_as_proxied() {
    let call = Call {
        id: 1,
        target: target("lease", Some("127.0.0.12:6443")),
        path: "/apis/x.io/v1".into(),
    };
    let want = vec![
        (":method", "GET"),
        (":path", "/apis/x.io/v1"),
        (":authority", "kubernetes.default.svc"),
        ("accept", "application/json"),
        ("x-kubernetes-peer-proxied", "true"),
        ("authorization", "Bearer t"),
    ];
    let config = |lease: &str| {
        let json = format!(
            r#"{{"local_cluster":"local","discovery_authority":"kubernetes.default.svc",
               "discovery_headers":{{"authorization":"Bearer t"}}{lease}}}"#
        );
        Config::parse(json.as_bytes()).expect("config")
    };
    let without = config("");
    assert_eq!(
        call.headers(&without),
        want,
        "without lease discovery no address header is sent"
    );
    let leases = config(
        r#","lease_discovery":{"cluster":"lease","address_header":"x-kube-peer-proxy-peer-address","local_hostname":"h"}"#,
    );
    let mut with_address = want.clone();
    with_address.push(("x-kube-peer-proxy-peer-address", "127.0.0.12:6443"));
    assert_eq!(call.headers(&leases), with_address);
}
