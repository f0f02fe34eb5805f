//! The EndpointSlice `default/kubernetes` → peer membership: real shapes, readiness, own exclusion,
//! ports, and every reason the whole document is refused.
#![cfg(test)]

mod common;

use std::net::IpAddr;

use common::fixture;
use kube_peer_proxy::discovery::endpoints::{parse_endpoint_slice, parse_endpoint_slice_members, ENDPOINT_SLICE_PATH};
use kube_peer_proxy::discovery::leases::{parse_address, LeasePeer, Members};

/// As kube-apiserver v1.36.3 serves it: three apiservers (198.18.0.11-13, --secure-port 6443), read
/// with `GET` from the first (tests/fixtures/k8s-discovery/PROVENANCE.md).
const IPV4: &str = "endpointslice_kubernetes.k8s-1.36.3.ipv4.json";
/// The same with an IPv6 service CIDR and advertise addresses.
const IPV6: &str = "endpointslice_kubernetes.k8s-1.36.3.ipv6.json";

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().expect("test IP"))
}

fn member(ip: &str, address: Option<&str>) -> LeasePeer {
    LeasePeer {
        id: ip.into(),
        holder: String::new(),
        hostname: String::new(),
        address: address.map(Into::into),
        expires_ms: None,
    }
}

fn ids(peers: &[LeasePeer]) -> Vec<&str> {
    peers.iter().map(|p| p.id.as_str()).collect()
}

/// A slice as the reconciler writes it, with these endpoints and ports (JSON text).
fn slice(address_type: &str, endpoints: &str, ports: &str) -> String {
    format!(
        r#"{{"kind":"EndpointSlice","apiVersion":"discovery.k8s.io/v1","metadata":{{"name":"kubernetes","namespace":"default","labels":{{"kubernetes.io/service-name":"kubernetes"}}}},"addressType":"{address_type}","endpoints":{endpoints},"ports":{ports}}}"#
    )
}

const HTTPS: &str = r#"[{"name":"https","protocol":"TCP","port":6443}]"#;

fn ready(ips: &[&str]) -> String {
    let list: Vec<String> = ips
        .iter()
        .map(|i| format!(r#"{{"addresses":["{i}"],"conditions":{{"ready":true}}}}"#))
        .collect();
    format!("[{}]", list.join(","))
}

#[test]
fn path_is_the_one_named_object() {
    assert_eq!(
        ENDPOINT_SLICE_PATH,
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"
    );
}

#[test]
fn real_ipv4_slice_gives_the_other_apiservers() {
    let body = fixture(IPV4);
    let peers = parse_endpoint_slice(&body, ip("198.18.0.11"), None).expect("v1.36.3 slice");
    assert_eq!(
        peers,
        vec![
            member("198.18.0.12", Some("198.18.0.12:6443")),
            member("198.18.0.13", Some("198.18.0.13:6443"))
        ]
    );
    // peer_port replaces the slice's port (in kubeadm's layout that is Envoy's client listener).
    let peers = parse_endpoint_slice(&body, ip("198.18.0.12"), Some(6444)).expect("slice");
    assert_eq!(
        peers,
        vec![
            member("198.18.0.11", Some("198.18.0.11:6444")),
            member("198.18.0.13", Some("198.18.0.13:6444"))
        ]
    );
    // Own IP not in the slice (or unknown): every entry is a peer.
    assert_eq!(
        ids(&parse_endpoint_slice(&body, None, None).expect("slice")),
        ["198.18.0.11", "198.18.0.12", "198.18.0.13"]
    );
}

#[test]
fn real_ipv6_slice_names_members_canonically_and_brackets_addresses() {
    let body = fixture(IPV6);
    let peers = parse_endpoint_slice(&body, ip("fd00:198:18::11"), None).expect("v1.36.3 IPv6 slice");
    assert_eq!(
        peers,
        vec![
            member("fd00:198:18::12", Some("[fd00:198:18::12]:6443")),
            member("fd00:198:18::13", Some("[fd00:198:18::13]:6443"))
        ]
    );
    // A non-canonical spelling is the same IP: named and excluded canonically.
    let body = slice("IPv6", &ready(&["FD00:0:0::2", "fd00::1", "fd00:0::3"]), HTTPS);
    let peers = parse_endpoint_slice(body.as_bytes(), ip("fd00::1"), None).expect("slice");
    assert_eq!(
        peers,
        vec![
            member("fd00::2", Some("[fd00::2]:6443")),
            member("fd00::3", Some("[fd00::3]:6443"))
        ]
    );
    for p in &peers {
        let a = p.address.as_deref().expect("address");
        assert_eq!(parse_address(a).as_deref(), Some(a), "canonical");
    }
}

#[test]
fn empty_slices_are_valid_and_have_no_members() {
    // Go writes a nil list as null; a list with only this server in it has no peers.
    for endpoints in [
        "null",
        "[]",
        r#"[{"addresses":["10.0.0.1"],"conditions":{"ready":true}}]"#,
    ] {
        let body = slice("IPv4", endpoints, HTTPS);
        assert_eq!(
            parse_endpoint_slice(body.as_bytes(), ip("10.0.0.1"), None),
            Ok(vec![]),
            "{endpoints}"
        );
    }
    let no_field = r#"{"kind":"EndpointSlice","metadata":{"name":"kubernetes"},"addressType":"IPv4","ports":[{"name":"https","port":6443}]}"#;
    assert_eq!(parse_endpoint_slice(no_field.as_bytes(), None, None), Ok(vec![]));
}

#[test]
fn only_ready_or_unknown_endpoints_are_members() {
    let endpoints = r#"[
        {"addresses":["10.0.0.2"],"conditions":{"ready":true}},
        {"addresses":["10.0.0.3"],"conditions":{"ready":false}},
        {"addresses":["10.0.0.4"],"conditions":{"ready":null}},
        {"addresses":["10.0.0.5"],"conditions":{}},
        {"addresses":["10.0.0.6"],"conditions":null},
        {"addresses":["10.0.0.7"]},
        {"addresses":["10.0.0.8"],"conditions":{"ready":false,"serving":true,"terminating":true}}
    ]"#;
    let peers = parse_endpoint_slice(slice("IPv4", endpoints, HTTPS).as_bytes(), None, None).expect("slice");
    assert_eq!(
        ids(&peers),
        ["10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7"],
        "ready false is not a member; absent or null means ready (the API's unknown)"
    );
}

#[test]
fn own_server_duplicates_and_order() {
    let endpoints = r#"[
        {"addresses":["10.0.0.3"]},
        {"addresses":["10.0.0.1"]},
        {"addresses":["10.0.0.20"]},
        {"addresses":["10.0.0.3"],"conditions":{"ready":true}},
        {"addresses":[]},
        {"addresses":null},
        {"addresses":["10.0.0.9","10.0.0.10"]}
    ]"#;
    let peers = parse_endpoint_slice(slice("IPv4", endpoints, HTTPS).as_bytes(), ip("10.0.0.1"), None).expect("slice");
    assert_eq!(
        ids(&peers),
        ["10.0.0.20", "10.0.0.3", "10.0.0.9"],
        "own IP out, one member per IP, sorted by id; an endpoint is its first address"
    );
    // The own server is recognised by IP only: its port may differ from the slice's.
    let one = slice("IPv4", &ready(&["10.0.0.1"]), r#"[{"name":"https","port":443}]"#);
    assert_eq!(parse_endpoint_slice(one.as_bytes(), ip("10.0.0.1"), None), Ok(vec![]));
}

#[test]
fn the_port_is_https_or_the_only_one_unless_peer_port_is_set() {
    let ips = ready(&["10.0.0.2"]);
    let port_of = |ports: &str, peer_port: Option<u16>| {
        parse_endpoint_slice(slice("IPv4", &ips, ports).as_bytes(), None, peer_port)
            .map(|p| p.first().and_then(|m| m.address.clone()).unwrap_or_default())
    };
    assert_eq!(port_of(HTTPS, None).as_deref(), Ok("10.0.0.2:6443"));
    assert_eq!(
        port_of(
            r#"[{"name":"metrics","protocol":"TCP","port":9000},{"name":"https","protocol":"TCP","port":8443}]"#,
            None
        )
        .as_deref(),
        Ok("10.0.0.2:8443")
    );
    assert_eq!(
        port_of(r#"[{"port":6443}]"#, None).as_deref(),
        Ok("10.0.0.2:6443"),
        "the only port"
    );
    assert_eq!(
        port_of("null", Some(6444)).as_deref(),
        Ok("10.0.0.2:6444"),
        "peer_port needs none"
    );
    assert_eq!(
        port_of(r#"[{"name":"https","port":0}]"#, Some(6444)).as_deref(),
        Ok("10.0.0.2:6444")
    );
    for ports in [
        "null",
        "[]",
        r#"[{"name":"a","port":1},{"name":"b","port":2}]"#,
        r#"[{"name":"https","port":0}]"#,
        r#"[{"name":"https","port":65536}]"#,
        r#"[{"name":"https","port":-1}]"#,
        r#"[{"name":"https"}]"#,
        r#"[{"name":"https","port":null}]"#,
        r#"[{"name":"https","protocol":"UDP","port":6443}]"#,
    ] {
        let err = port_of(ports, None).expect_err(ports);
        assert!(err.contains("no usable port"), "{ports}: {err}");
    }
}

#[test]
fn unusable_ips_are_members_without_an_address() {
    // parse_address's rules: loopback is an address (tests run there), unspecified, multicast and
    // broadcast are not; such a member is never fetched, like a lease without an address.
    let v4 = slice(
        "IPv4",
        &ready(&["127.0.0.2", "0.0.0.0", "224.0.0.1", "255.255.255.255"]),
        HTTPS,
    );
    let peers = parse_endpoint_slice(v4.as_bytes(), None, None).expect("slice");
    assert_eq!(
        peers,
        vec![
            member("0.0.0.0", None),
            member("127.0.0.2", Some("127.0.0.2:6443")),
            member("224.0.0.1", None),
            member("255.255.255.255", None)
        ]
    );
    let v6 = slice("IPv6", &ready(&["::", "ff02::1", "::1"]), HTTPS);
    let peers = parse_endpoint_slice(v6.as_bytes(), None, None).expect("slice");
    assert_eq!(
        peers,
        vec![
            member("::", None),
            member("::1", Some("[::1]:6443")),
            member("ff02::1", None)
        ]
    );
}

#[test]
fn a_document_that_is_not_the_slice_is_refused_whole() {
    struct Bad {
        desc: &'static str,
        body: String,
        contains: &'static str,
    }
    let good = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value =
            serde_json::from_str(&slice("IPv4", &ready(&["10.0.0.2"]), HTTPS)).expect("json");
        f(&mut v);
        v.to_string()
    };
    let rows = [
        Bad {
            desc: "empty body",
            body: String::new(),
            contains: "not a JSON object",
        },
        Bad {
            desc: "an array",
            body: "[]".into(),
            contains: "not a JSON object",
        },
        Bad {
            desc: "a string",
            body: r#""kubernetes""#.into(),
            contains: "not a JSON object",
        },
        Bad {
            desc: "truncated",
            body: slice("IPv4", &ready(&["10.0.0.2"]), HTTPS)[..60].to_string(),
            contains: "invalid JSON",
        },
        Bad {
            desc: "a Status (the apiserver's 404 body, served as 200 by something else)",
            body:
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"NotFound","code":404}"#
                    .into(),
            contains: "kind \"Status\"",
        },
        Bad {
            desc: "a list of slices",
            body: good(&|v| v["kind"] = "EndpointSliceList".into()),
            contains: "kind \"EndpointSliceList\"",
        },
        Bad {
            desc: "the dual-stack secondary slice",
            body: good(&|v| v["metadata"]["name"] = "kubernetes-v6".into()),
            contains: "metadata.name \"kubernetes-v6\"",
        },
        Bad {
            desc: "no name",
            body: good(&|v| v["metadata"] = serde_json::json!({})),
            contains: "metadata.name \"\"",
        },
        Bad {
            desc: "another namespace",
            body: good(&|v| v["metadata"]["namespace"] = "kube-system".into()),
            contains: "metadata.namespace \"kube-system\"",
        },
        Bad {
            desc: "FQDN slice",
            body: good(&|v| v["addressType"] = "FQDN".into()),
            contains: "addressType \"FQDN\"",
        },
        Bad {
            desc: "no addressType",
            body: good(&|v| {
                v.as_object_mut().map(|o| o.remove("addressType"));
            }),
            contains: "addressType \"\"",
        },
        Bad {
            desc: "lower-case addressType",
            body: good(&|v| v["addressType"] = "ipv4".into()),
            contains: "addressType \"ipv4\"",
        },
        Bad {
            desc: "IPv6 address in an IPv4 slice",
            body: slice("IPv4", &ready(&["10.0.0.2", "fd00::2"]), HTTPS),
            contains: "endpoints[1]: \"fd00::2\" is not an IPv4 address",
        },
        Bad {
            desc: "IPv4 address in an IPv6 slice",
            body: slice("IPv6", &ready(&["10.0.0.2"]), HTTPS),
            contains: "is not an IPv6 address",
        },
        Bad {
            desc: "a hostname",
            body: slice("IPv4", &ready(&["cp-2"]), HTTPS),
            contains: "\"cp-2\" is not an IPv4 address",
        },
        Bad {
            desc: "an address with a port",
            body: slice("IPv4", &ready(&["10.0.0.2:6443"]), HTTPS),
            contains: "is not an IPv4 address",
        },
        Bad {
            desc: "a leading zero (Go's parser refuses it too)",
            body: slice("IPv4", &ready(&["10.0.0.02"]), HTTPS),
            contains: "is not an IPv4 address",
        },
        Bad {
            desc: "an IPv6 zone",
            body: slice("IPv6", &ready(&["fe80::1%eth0"]), HTTPS),
            contains: "is not an IPv6 address",
        },
        Bad {
            desc: "an invalid second address of a not-ready endpoint",
            body: slice(
                "IPv4",
                r#"[{"addresses":["10.0.0.2","nope"],"conditions":{"ready":false}}]"#,
                HTTPS,
            ),
            contains: "\"nope\"",
        },
        Bad {
            desc: "addresses not a list",
            body: slice("IPv4", r#"[{"addresses":"10.0.0.2"}]"#, HTTPS),
            contains: "invalid JSON",
        },
        Bad {
            desc: "ready a string",
            body: slice(
                "IPv4",
                r#"[{"addresses":["10.0.0.2"],"conditions":{"ready":"true"}}]"#,
                HTTPS,
            ),
            contains: "invalid JSON",
        },
        Bad {
            desc: "port a string",
            body: slice("IPv4", &ready(&["10.0.0.2"]), r#"[{"name":"https","port":"6443"}]"#),
            contains: "invalid JSON",
        },
        Bad {
            desc: "endpoints an object",
            body: slice("IPv4", "{}", HTTPS),
            contains: "invalid JSON",
        },
        Bad {
            desc: "no usable port",
            body: slice("IPv4", &ready(&["10.0.0.2"]), "null"),
            contains: "no usable port",
        },
    ];
    for row in rows {
        let err = parse_endpoint_slice(row.body.as_bytes(), None, None).expect_err(row.desc);
        assert!(err.starts_with("EndpointSlice: "), "{}: {err}", row.desc);
        assert!(
            err.contains(row.contains),
            "{}: error {err:?} does not contain {:?}",
            row.desc,
            row.contains
        );
    }
    // Leniency where Go's decoder is lenient too: no kind (a watch event's object), unknown fields.
    let bare = r#"{"metadata":{"name":"kubernetes"},"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.2"],"zone":"a","hints":{}}],"ports":[{"name":"https","port":6443,"appProtocol":"https"}],"extra":1}"#;
    assert_eq!(
        parse_endpoint_slice(bare.as_bytes(), None, None),
        Ok(vec![member("10.0.0.2", Some("10.0.0.2:6443"))])
    );
}

/// A slice counts only if it lists this server (see `Members`): right after a server starts, the
/// others may write it from a view without this server for up to one reconcile (10 s).
#[test]
fn members_say_whether_this_server_is_in_the_slice() {
    let body = fixture(IPV4);
    let m = parse_endpoint_slice_members(&body, ip("198.18.0.11"), None).expect("v1.36.3 slice");
    assert!(m.own_listed);
    assert_eq!(m.peers, parse_endpoint_slice(&body, ip("198.18.0.11"), None).unwrap());
    for own in [ip("198.18.0.14"), None] {
        let m = parse_endpoint_slice_members(&body, own, None).expect("slice");
        assert!(!m.own_listed, "{own:?}");
        assert_eq!(m.peers.len(), 3, "{own:?}: still parsed; the caller decides");
    }
    let ipv6 = fixture(IPV6);
    assert!(
        parse_endpoint_slice_members(&ipv6, ip("fd00:198:18::13"), None)
            .unwrap()
            .own_listed
    );
    assert!(
        !parse_endpoint_slice_members(&ipv6, ip("198.18.0.11"), None)
            .unwrap()
            .own_listed
    );
    // Ready or not, and any address of an endpoint, canonically compared.
    let endpoints = r#"[
        {"addresses":["10.0.0.2"],"conditions":{"ready":true}},
        {"addresses":["10.0.0.1"],"conditions":{"ready":false}},
        {"addresses":["10.0.0.5","10.0.0.6"]}
    ]"#;
    let body = slice("IPv4", endpoints, HTTPS);
    for own in ["10.0.0.1", "10.0.0.2", "10.0.0.6"] {
        assert!(
            parse_endpoint_slice_members(body.as_bytes(), ip(own), None)
                .unwrap()
                .own_listed,
            "{own}"
        );
    }
    assert!(
        !parse_endpoint_slice_members(body.as_bytes(), ip("10.0.0.3"), None)
            .unwrap()
            .own_listed
    );
    let body = slice("IPv6", &ready(&["FD00:0:0::1"]), HTTPS);
    assert!(
        parse_endpoint_slice_members(body.as_bytes(), ip("fd00::1"), None)
            .unwrap()
            .own_listed
    );
    // Empty: nobody listed, this server neither.
    for endpoints in ["null", "[]", r#"[{"addresses":[]}]"#] {
        let m = parse_endpoint_slice_members(slice("IPv4", endpoints, HTTPS).as_bytes(), ip("10.0.0.1"), None).unwrap();
        assert_eq!(m, Members::default(), "{endpoints}");
    }
}
