//! Plugin configuration: parsing, defaults and field-naming rejections.
#![cfg(test)]

use std::time::Duration;

use kube_peer_proxy::config::{parse_duration, Config, Peer, DISCOVERY_ROOT_ID};

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::parse(br#"{"local_cluster":"apiserver-a"}"#).expect("minimal");
    let want = Config {
        local_cluster: "apiserver-a".into(),
        ..Config::default()
    };
    assert_eq!(c, want);
    assert_eq!(c.local_name, "local");
    assert_eq!(c.route_header, "x-kube-peer-proxy-cluster");
    assert_eq!(c.refresh_interval, Duration::from_secs(5));
    assert_eq!(c.fetch_timeout, Duration::from_secs(2));
    assert_eq!(c.staleness_limit, Duration::from_secs(30));
    assert_eq!(c.retry_after_seconds, 1);
    assert_eq!(c.discovery_authority, "kubernetes.default.svc");
    assert!(c.discovery_headers.is_empty());
    assert_eq!(c.max_discovery_bytes, 16 << 20);
    assert!(c.merged_discovery);
    assert!(c.peers.is_empty());
    assert_eq!(c.clusters().collect::<Vec<_>>(), ["apiserver-a"]);
    assert!(!DISCOVERY_ROOT_ID.is_empty());
}

#[test]
fn full_config() {
    let c = Config::parse(
        br#"{
        "local_name": "apiserver-a",
        "local_cluster": "local_a",
        "peers": [{"name": "apiserver-b", "cluster": "peer_b"}, {"cluster": "peer_c", "name": "apiserver-c"}],
        "route_header": "x-route-to",
        "refresh_interval": "500ms",
        "fetch_timeout": "250ms",
        "staleness_limit": "1m",
        "retry_after_seconds": 7,
        "discovery_authority": "kubernetes.default.svc.cluster.local",
        "discovery_headers": {"authorization": "Bearer abc", "x-extra_1.two": "v"},
        "max_discovery_bytes": 1048576,
        "merged_discovery": false
    }"#,
    )
    .expect("full");
    assert_eq!(c.local_name, "apiserver-a");
    assert_eq!(c.local_cluster, "local_a");
    assert_eq!(
        c.peers,
        vec![
            Peer {
                name: "apiserver-b".into(),
                cluster: "peer_b".into()
            },
            Peer {
                name: "apiserver-c".into(),
                cluster: "peer_c".into()
            },
        ]
    );
    assert_eq!(c.route_header, "x-route-to");
    assert_eq!(c.refresh_interval, Duration::from_millis(500));
    assert_eq!(c.fetch_timeout, Duration::from_millis(250));
    assert_eq!(c.staleness_limit, Duration::from_secs(60));
    assert_eq!(c.retry_after_seconds, 7);
    assert_eq!(c.discovery_authority, "kubernetes.default.svc.cluster.local");
    let mut headers = c.discovery_headers.clone();
    headers.sort();
    assert_eq!(
        headers,
        vec![
            ("authorization".to_string(), "Bearer abc".to_string()),
            ("x-extra_1.two".to_string(), "v".to_string())
        ]
    );
    assert_eq!(c.max_discovery_bytes, 1 << 20);
    assert!(!c.merged_discovery);
    assert_eq!(c.clusters().collect::<Vec<_>>(), ["local_a", "peer_b", "peer_c"]);
}

#[test]
fn accepted_edge_values() {
    struct Good {
        desc: &'static str,
        json: String,
    }
    let peers: Vec<String> = (0..63)
        .map(|i| format!(r#"{{"name":"p{i}","cluster":"c{i}"}}"#))
        .collect();
    let rows = [
        Good {
            desc: "empty peers",
            json: r#"{"local_cluster":"a","peers":[]}"#.into(),
        },
        Good {
            desc: "empty discovery headers",
            json: r#"{"local_cluster":"a","discovery_headers":{}}"#.into(),
        },
        Good {
            desc: "staleness equal to refresh",
            json: r#"{"local_cluster":"a","refresh_interval":"10s","staleness_limit":"10s"}"#.into(),
        },
        Good {
            desc: "merged_discovery true",
            json: r#"{"local_cluster":"a","merged_discovery":true}"#.into(),
        },
        Good {
            desc: "retry_after_seconds u32::MAX",
            json: r#"{"local_cluster":"a","retry_after_seconds":4294967295}"#.into(),
        },
        Good {
            desc: "63 peers is the maximum",
            json: format!(r#"{{"local_cluster":"a","peers":[{}]}}"#, peers.join(",")),
        },
    ];
    for row in rows {
        assert!(Config::parse(row.json.as_bytes()).is_ok(), "{}", row.desc);
    }
}

#[test]
fn rejections_name_the_field() {
    struct Bad {
        desc: &'static str,
        json: &'static str,
        /// The error must start with this (the offending field).
        field: &'static str,
        /// And contain this.
        contains: &'static str,
    }
    let rows = [
        Bad {
            desc: "invalid JSON",
            json: "{",
            field: "configuration",
            contains: "invalid JSON",
        },
        Bad {
            desc: "empty input",
            json: "",
            field: "configuration",
            contains: "invalid JSON",
        },
        Bad {
            desc: "array",
            json: "[]",
            field: "configuration",
            contains: "JSON object",
        },
        Bad {
            desc: "string",
            json: r#""x""#,
            field: "configuration",
            contains: "JSON object",
        },
        Bad {
            desc: "null",
            json: "null",
            field: "configuration",
            contains: "JSON object",
        },
        Bad {
            desc: "missing local_cluster",
            json: "{}",
            field: "local_cluster",
            contains: "missing",
        },
        Bad {
            desc: "unknown top-level field",
            json: r#"{"local_cluster":"a","bogus":1}"#,
            field: "bogus",
            contains: "unknown field",
        },
        Bad {
            desc: "misspelled field",
            json: r#"{"local_cluster":"a","refresh":"5s"}"#,
            field: "refresh",
            contains: "refresh_interval",
        },
        Bad {
            desc: "local_cluster not a string",
            json: r#"{"local_cluster":5}"#,
            field: "local_cluster",
            contains: "expected a string",
        },
        Bad {
            desc: "local_cluster empty",
            json: r#"{"local_cluster":""}"#,
            field: "local_cluster",
            contains: "must not be empty",
        },
        Bad {
            desc: "local_cluster blank",
            json: r#"{"local_cluster":"  "}"#,
            field: "local_cluster",
            contains: "must not be empty",
        },
        Bad {
            desc: "local_name empty",
            json: r#"{"local_cluster":"a","local_name":""}"#,
            field: "local_name",
            contains: "must not be empty",
        },
        Bad {
            desc: "local_name wrong type",
            json: r#"{"local_cluster":"a","local_name":true}"#,
            field: "local_name",
            contains: "a boolean",
        },
        Bad {
            desc: "discovery_authority empty",
            json: r#"{"local_cluster":"a","discovery_authority":""}"#,
            field: "discovery_authority",
            contains: "must not be empty",
        },
        Bad {
            desc: "refresh_interval a number",
            json: r#"{"local_cluster":"a","refresh_interval":5}"#,
            field: "refresh_interval",
            contains: "a number",
        },
        Bad {
            desc: "refresh_interval zero",
            json: r#"{"local_cluster":"a","refresh_interval":"0s"}"#,
            field: "refresh_interval",
            contains: "positive",
        },
        Bad {
            desc: "refresh_interval 0ms",
            json: r#"{"local_cluster":"a","refresh_interval":"0ms"}"#,
            field: "refresh_interval",
            contains: "positive",
        },
        Bad {
            desc: "refresh_interval negative",
            json: r#"{"local_cluster":"a","refresh_interval":"-1s"}"#,
            field: "refresh_interval",
            contains: "duration",
        },
        Bad {
            desc: "refresh_interval no unit",
            json: r#"{"local_cluster":"a","refresh_interval":"5"}"#,
            field: "refresh_interval",
            contains: "duration",
        },
        Bad {
            desc: "refresh_interval hours",
            json: r#"{"local_cluster":"a","refresh_interval":"1h"}"#,
            field: "refresh_interval",
            contains: "duration",
        },
        Bad {
            desc: "refresh_interval fraction",
            json: r#"{"local_cluster":"a","refresh_interval":"1.5s"}"#,
            field: "refresh_interval",
            contains: "duration",
        },
        Bad {
            desc: "fetch_timeout zero",
            json: r#"{"local_cluster":"a","fetch_timeout":"0m"}"#,
            field: "fetch_timeout",
            contains: "positive",
        },
        Bad {
            desc: "fetch_timeout wrong type",
            json: r#"{"local_cluster":"a","fetch_timeout":[]}"#,
            field: "fetch_timeout",
            contains: "an array",
        },
        Bad {
            desc: "staleness_limit zero",
            json: r#"{"local_cluster":"a","staleness_limit":"0s"}"#,
            field: "staleness_limit",
            contains: "positive",
        },
        Bad {
            desc: "staleness_limit empty",
            json: r#"{"local_cluster":"a","staleness_limit":""}"#,
            field: "staleness_limit",
            contains: "duration",
        },
        Bad {
            desc: "staleness below refresh",
            json: r#"{"local_cluster":"a","refresh_interval":"10s","staleness_limit":"5s"}"#,
            field: "staleness_limit",
            contains: "refresh_interval",
        },
        Bad {
            desc: "default staleness below a long refresh",
            json: r#"{"local_cluster":"a","refresh_interval":"1m"}"#,
            field: "staleness_limit",
            contains: "refresh_interval",
        },
        Bad {
            desc: "retry_after_seconds zero",
            json: r#"{"local_cluster":"a","retry_after_seconds":0}"#,
            field: "retry_after_seconds",
            contains: "positive",
        },
        Bad {
            desc: "retry_after_seconds negative",
            json: r#"{"local_cluster":"a","retry_after_seconds":-3}"#,
            field: "retry_after_seconds",
            contains: "positive",
        },
        Bad {
            desc: "retry_after_seconds fraction",
            json: r#"{"local_cluster":"a","retry_after_seconds":1.5}"#,
            field: "retry_after_seconds",
            contains: "positive",
        },
        Bad {
            desc: "retry_after_seconds string",
            json: r#"{"local_cluster":"a","retry_after_seconds":"1"}"#,
            field: "retry_after_seconds",
            contains: "a string",
        },
        Bad {
            desc: "retry_after_seconds too large",
            json: r#"{"local_cluster":"a","retry_after_seconds":4294967296}"#,
            field: "retry_after_seconds",
            contains: "too large",
        },
        Bad {
            desc: "max_discovery_bytes zero",
            json: r#"{"local_cluster":"a","max_discovery_bytes":0}"#,
            field: "max_discovery_bytes",
            contains: "positive",
        },
        Bad {
            desc: "merged_discovery string",
            json: r#"{"local_cluster":"a","merged_discovery":"yes"}"#,
            field: "merged_discovery",
            contains: "boolean",
        },
        Bad {
            desc: "route_header upper case",
            json: r#"{"local_cluster":"a","route_header":"X-Route"}"#,
            field: "route_header",
            contains: "header name",
        },
        Bad {
            desc: "route_header pseudo",
            json: r#"{"local_cluster":"a","route_header":":authority"}"#,
            field: "route_header",
            contains: "header name",
        },
        Bad {
            desc: "route_header empty",
            json: r#"{"local_cluster":"a","route_header":""}"#,
            field: "route_header",
            contains: "header name",
        },
        Bad {
            desc: "route_header space",
            json: r#"{"local_cluster":"a","route_header":"x route"}"#,
            field: "route_header",
            contains: "header name",
        },
        Bad {
            desc: "discovery_headers not an object",
            json: r#"{"local_cluster":"a","discovery_headers":[]}"#,
            field: "discovery_headers",
            contains: "an object",
        },
        Bad {
            desc: "discovery header upper case",
            json: r#"{"local_cluster":"a","discovery_headers":{"Authorization":"x"}}"#,
            field: "discovery_headers.Authorization",
            contains: "header name",
        },
        Bad {
            desc: "discovery header pseudo",
            json: r#"{"local_cluster":"a","discovery_headers":{":path":"/x"}}"#,
            field: "discovery_headers.:path",
            contains: "header name",
        },
        Bad {
            desc: "discovery header empty name",
            json: r#"{"local_cluster":"a","discovery_headers":{"":"x"}}"#,
            field: "discovery_headers.",
            contains: "header name",
        },
        Bad {
            desc: "discovery header value not a string",
            json: r#"{"local_cluster":"a","discovery_headers":{"x-a":1}}"#,
            field: "discovery_headers.x-a",
            contains: "expected a string",
        },
        Bad {
            desc: "peers not an array",
            json: r#"{"local_cluster":"a","peers":{}}"#,
            field: "peers",
            contains: "an array",
        },
        Bad {
            desc: "peer not an object",
            json: r#"{"local_cluster":"a","peers":["b"]}"#,
            field: "peers[0]",
            contains: "an object",
        },
        Bad {
            desc: "unknown peer field",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":"b","port":1}]}"#,
            field: "peers[0].port",
            contains: "unknown field",
        },
        Bad {
            desc: "peer without cluster",
            json: r#"{"local_cluster":"a","peers":[{"name":"b"}]}"#,
            field: "peers[0].cluster",
            contains: "missing",
        },
        Bad {
            desc: "peer without name",
            json: r#"{"local_cluster":"a","peers":[{"cluster":"b"}]}"#,
            field: "peers[0].name",
            contains: "missing",
        },
        Bad {
            desc: "second peer without cluster",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":"b"},{"name":"c"}]}"#,
            field: "peers[1].cluster",
            contains: "missing",
        },
        Bad {
            desc: "peer name empty",
            json: r#"{"local_cluster":"a","peers":[{"name":"","cluster":"b"}]}"#,
            field: "peers[0].name",
            contains: "must not be empty",
        },
        Bad {
            desc: "peer cluster empty",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":" "}]}"#,
            field: "peers[0].cluster",
            contains: "must not be empty",
        },
        Bad {
            desc: "peer name wrong type",
            json: r#"{"local_cluster":"a","peers":[{"name":1,"cluster":"b"}]}"#,
            field: "peers[0].name",
            contains: "expected a string",
        },
        Bad {
            desc: "peer cluster wrong type",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":null}]}"#,
            field: "peers[0].cluster",
            contains: "null",
        },
        Bad {
            desc: "duplicate peer names",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":"b1"},{"name":"b","cluster":"b2"}]}"#,
            field: "peers[1].name",
            contains: "duplicate",
        },
        Bad {
            desc: "peer named like the local server",
            json: r#"{"local_cluster":"a","local_name":"me","peers":[{"name":"me","cluster":"b"}]}"#,
            field: "peers[0].name",
            contains: "duplicate",
        },
        Bad {
            desc: "peer named like the default local name",
            json: r#"{"local_cluster":"a","peers":[{"name":"local","cluster":"b"}]}"#,
            field: "peers[0].name",
            contains: "duplicate",
        },
        Bad {
            desc: "duplicate peer clusters",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":"x"},{"name":"c","cluster":"x"}]}"#,
            field: "peers[1].cluster",
            contains: "duplicate",
        },
        Bad {
            desc: "peer cluster equal to the local cluster",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":"a"}]}"#,
            field: "peers[0].cluster",
            contains: "duplicate",
        },
        Bad {
            desc: "lease_discovery not an object",
            json: r#"{"local_cluster":"a","lease_discovery":[]}"#,
            field: "lease_discovery",
            contains: "expected an object",
        },
        Bad {
            desc: "lease_discovery with peers",
            json: r#"{"local_cluster":"a","peers":[{"name":"b","cluster":"b"}],"lease_discovery":{"cluster":"p","local_hostname":"h"}}"#,
            field: "lease_discovery",
            contains: "cannot be combined",
        },
        Bad {
            desc: "lease_discovery unknown field",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","bogus":1}}"#,
            field: "lease_discovery.bogus",
            contains: "unknown field",
        },
        Bad {
            desc: "lease_discovery cluster missing",
            json: r#"{"local_cluster":"a","lease_discovery":{"local_hostname":"h"}}"#,
            field: "lease_discovery.cluster",
            contains: "missing",
        },
        Bad {
            desc: "lease_discovery cluster is local",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"a","local_hostname":"h"}}"#,
            field: "lease_discovery.cluster",
            contains: "differ",
        },
        Bad {
            desc: "lease_discovery address header invalid",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","address_header":"X-Up"}}"#,
            field: "lease_discovery.address_header",
            contains: "not a valid",
        },
        Bad {
            desc: "lease_discovery address header is the route header",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","address_header":"x-kube-peer-proxy-cluster"}}"#,
            field: "lease_discovery.address_header",
            contains: "differ",
        },
        Bad {
            desc: "lease_discovery without own identity",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p"}}"#,
            field: "lease_discovery.local_hostname",
            contains: "missing",
        },
        Bad {
            desc: "lease mode, a local_name other than the lease hostname the peers name this server by",
            json: r#"{"local_cluster":"a","local_name":"a","lease_discovery":{"cluster":"p","local_hostname":"cp-1"}}"#,
            field: "local_name",
            contains: "differs from lease_discovery.local_hostname \"cp-1\"",
        },
        Bad {
            desc: "lease_discovery empty hostname",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":" "}}"#,
            field: "lease_discovery.local_hostname",
            contains: "empty",
        },
        Bad {
            desc: "lease_discovery local address a hostname",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_address":"cp-1:6443"}}"#,
            field: "lease_discovery.local_address",
            contains: "not an ip:port",
        },
        Bad {
            desc: "lease_discovery hosts not an object",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","hosts":[]}}"#,
            field: "lease_discovery.hosts",
            contains: "expected an object",
        },
        Bad {
            desc: "lease_discovery hosts value not a string",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","hosts":{"cp-2":1}}}"#,
            field: "lease_discovery.hosts.cp-2",
            contains: "expected a string",
        },
        Bad {
            desc: "lease_discovery hosts address without port",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","hosts":{"cp-2":"10.0.0.2"}}}"#,
            field: "lease_discovery.hosts.cp-2",
            contains: "not an ip:port",
        },
        Bad {
            desc: "lease_discovery peer_port zero",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","peer_port":0}}"#,
            field: "lease_discovery.peer_port",
            contains: "1-65535",
        },
        Bad {
            desc: "lease_discovery peer_port above 65535",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","peer_port":65536}}"#,
            field: "lease_discovery.peer_port",
            contains: "1-65535",
        },
        Bad {
            desc: "lease_discovery peer_port negative",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","peer_port":-1}}"#,
            field: "lease_discovery.peer_port",
            contains: "1-65535",
        },
        Bad {
            desc: "lease_discovery peer_port fractional",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","peer_port":6444.5}}"#,
            field: "lease_discovery.peer_port",
            contains: "1-65535",
        },
        Bad {
            desc: "lease_discovery peer_port a string",
            json: r#"{"local_cluster":"a","lease_discovery":{"cluster":"p","local_hostname":"h","peer_port":"6444"}}"#,
            field: "lease_discovery.peer_port",
            contains: "expected a port number",
        },
        Bad {
            desc: "lease_discovery source unknown",
            json: r#"{"local_cluster":"a","lease_discovery":{"source":"endpoints","cluster":"p","local_hostname":"h"}}"#,
            field: "lease_discovery.source",
            contains: "not one of \"identity_leases\", \"kubernetes_endpoints\"",
        },
        Bad {
            desc: "lease_discovery source not a string",
            json: r#"{"local_cluster":"a","lease_discovery":{"source":1,"cluster":"p","local_hostname":"h"}}"#,
            field: "lease_discovery.source",
            contains: "expected a string",
        },
        Bad {
            desc: "kubernetes_endpoints without local_address",
            json: r#"{"local_cluster":"a","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p"}}"#,
            field: "lease_discovery.local_address",
            contains: "missing",
        },
        Bad {
            desc: "kubernetes_endpoints with local_hostname",
            json: r#"{"local_cluster":"a","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"10.0.0.1:6443","local_hostname":"cp-1"}}"#,
            field: "lease_discovery.local_hostname",
            contains: "not used with source \"kubernetes_endpoints\"",
        },
        Bad {
            desc: "kubernetes_endpoints with hosts",
            json: r#"{"local_cluster":"a","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"10.0.0.1:6443","hosts":{}}}"#,
            field: "lease_discovery.hosts",
            contains: "not used with source \"kubernetes_endpoints\"",
        },
        Bad {
            desc: "kubernetes_endpoints local_address without port",
            json: r#"{"local_cluster":"a","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"10.0.0.1"}}"#,
            field: "lease_discovery.local_address",
            contains: "not an ip:port",
        },
        Bad {
            desc: "kubernetes_endpoints, a local_name other than the IP the peers name this server by",
            json: r#"{"local_cluster":"a","local_name":"cp-1","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"10.0.0.1:6443"}}"#,
            field: "local_name",
            contains: "differs from lease_discovery.local_address's IP \"10.0.0.1\"",
        },
        Bad {
            desc: "kubernetes_endpoints, local_name an IPv6 literal not in canonical form",
            json: r#"{"local_cluster":"a","local_name":"FD00:0::1","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"[fd00::1]:6443"}}"#,
            field: "local_name",
            contains: "\"fd00::1\"",
        },
        Bad {
            desc: "client_identity not an object",
            json: r#"{"local_cluster":"a","client_identity":true}"#,
            field: "client_identity",
            contains: "expected an object",
        },
        Bad {
            desc: "client_identity unknown field",
            json: r#"{"local_cluster":"a","client_identity":{"username_headers":["x-remote-user"],"group_headers":["x-remote-group"],"users":[]}}"#,
            field: "client_identity.users",
            contains: "unknown field",
        },
        Bad {
            desc: "client_identity without username headers",
            json: r#"{"local_cluster":"a","client_identity":{"group_headers":["x-remote-group"]}}"#,
            field: "client_identity.username_headers",
            contains: "missing",
        },
        Bad {
            desc: "client_identity empty username headers",
            json: r#"{"local_cluster":"a","client_identity":{"username_headers":[],"group_headers":["x-remote-group"]}}"#,
            field: "client_identity.username_headers",
            contains: "at least one",
        },
        Bad {
            desc: "client_identity header not a string",
            json: r#"{"local_cluster":"a","client_identity":{"username_headers":[1],"group_headers":["x-remote-group"]}}"#,
            field: "client_identity.username_headers[0]",
            contains: "expected a string",
        },
        Bad {
            desc: "client_identity invalid header",
            json: r#"{"local_cluster":"a","client_identity":{"username_headers":["x remote"],"group_headers":["x-remote-group"]}}"#,
            field: "client_identity.username_headers[0]",
            contains: "not a valid header name",
        },
        Bad {
            desc: "client_identity prefix covering the route header",
            json: r#"{"local_cluster":"a","client_identity":{"username_headers":["x-remote-user"],"group_headers":["x-remote-group"],"extra_headers_prefixes":["x-kube-"]}}"#,
            field: "client_identity",
            contains: "routing header",
        },
    ];
    for row in rows {
        let err = Config::parse(row.json.as_bytes()).expect_err(row.desc);
        assert!(
            err.starts_with(row.field),
            "{}: error {err:?} does not start with {:?}",
            row.desc,
            row.field
        );
        assert!(
            err.contains(row.contains),
            "{}: error {err:?} does not contain {:?}",
            row.desc,
            row.contains
        );
    }
}

#[test]
fn too_many_peers() {
    let peers: Vec<String> = (0..64)
        .map(|i| format!(r#"{{"name":"p{i}","cluster":"c{i}"}}"#))
        .collect();
    let json = format!(r#"{{"local_cluster":"a","peers":[{}]}}"#, peers.join(","));
    let err = Config::parse(json.as_bytes()).expect_err("64 peers");
    assert!(err.starts_with("peers:"), "{err}");
    assert!(err.contains("63"), "{err}");
}

#[test]
fn durations() {
    struct D {
        input: &'static str,
        want: Option<Duration>,
    }
    let rows = [
        D {
            input: "500ms",
            want: Some(Duration::from_millis(500)),
        },
        D {
            input: "2s",
            want: Some(Duration::from_secs(2)),
        },
        D {
            input: "1m",
            want: Some(Duration::from_secs(60)),
        },
        D {
            input: "0s",
            want: Some(Duration::ZERO),
        },
        D {
            input: "007s",
            want: Some(Duration::from_secs(7)),
        },
        D {
            input: "1h",
            want: None,
        },
        D { input: "1", want: None },
        D { input: "s", want: None },
        D { input: "", want: None },
        D {
            input: "-1s",
            want: None,
        },
        D {
            input: "+1s",
            want: None,
        },
        D {
            input: "1.5s",
            want: None,
        },
        D {
            input: "1 s",
            want: None,
        },
        D {
            input: "1S",
            want: None,
        },
        D {
            input: "1sec",
            want: None,
        },
        D {
            input: "99999999999999999999s",
            want: None,
        },
        D {
            input: "999999999999999999m",
            want: None,
        },
    ];
    for row in rows {
        assert_eq!(parse_duration(row.input), row.want, "{:?}", row.input);
    }
}

#[test]
fn lease_discovery_config() {
    let c = Config::parse(
        br#"{"local_cluster":"local","lease_discovery":{"cluster":"peers-by-address","local_hostname":"cp-1",
             "local_address":"10.0.0.1:6443","hosts":{"cp-2":"10.0.0.2:6443","cp-3":"[fd00::3]:6443"}}}"#,
    )
    .expect("lease mode");
    let l = c.lease_discovery.clone().expect("lease_discovery");
    assert_eq!(l.cluster, "peers-by-address");
    assert_eq!(
        l.address_header, "x-envoy-original-dst-host",
        "Envoy's default ORIGINAL_DST header"
    );
    assert_eq!(l.local_hostname.as_deref(), Some("cp-1"));
    assert_eq!(l.local_address.as_deref(), Some("10.0.0.1:6443"));
    assert_eq!(
        l.hosts,
        vec![
            ("cp-2".to_string(), "10.0.0.2:6443".to_string()),
            ("cp-3".to_string(), "[fd00::3]:6443".to_string())
        ]
    );
    assert_eq!(c.clusters().collect::<Vec<_>>(), ["local", "peers-by-address"]);
    assert_eq!(l.peer_port, None, "the advertised port is kept unless peer_port is set");
    for (port, want) in [("6444", 6444), ("1", 1), ("65535", 65535)] {
        let json = format!(
            r#"{{"local_cluster":"local","lease_discovery":{{"cluster":"p","local_hostname":"cp-1","peer_port":{port}}}}}"#
        );
        let l = Config::parse(json.as_bytes())
            .expect("peer_port")
            .lease_discovery
            .expect("lease_discovery");
        assert_eq!(l.peer_port, Some(want));
    }
}

/// In lease mode the peers name each server by its lease's `kubernetes.io/hostname` (membership.rs),
/// so the local server is named by `local_hostname` too: every node then has the same names, which
/// merged discovery orders by and metrics and the status view label by. (A `local_name` that differs
/// is refused: `rejections_name_the_field`.)
#[test]
fn lease_mode_names_the_local_server_by_its_lease_hostname() {
    let parse = |json: &str| Config::parse(json.as_bytes()).expect(json);
    let derived = parse(r#"{"local_cluster":"l","lease_discovery":{"cluster":"p","local_hostname":"cp-1"}}"#);
    assert_eq!(derived.local_name, "cp-1", "local_name left out: the lease hostname");
    let same =
        parse(r#"{"local_cluster":"l","local_name":"cp-1","lease_discovery":{"cluster":"p","local_hostname":"cp-1"}}"#);
    assert_eq!(same, derived);
    // Outside lease mode, and in lease mode by address only (the hostname is not known), the
    // configured name (or "local") stays.
    assert_eq!(parse(r#"{"local_cluster":"l","local_name":"a"}"#).local_name, "a");
    let by_address = r#"{"local_cluster":"l","lease_discovery":{"cluster":"p","local_address":"10.0.0.1:6443"}}"#;
    assert_eq!(parse(by_address).local_name, "local");
}

/// From the EndpointSlice every member is named by its IP (src/discovery/endpoints.rs), so the local
/// server is named by local_address's IP, canonical, as the peers see it in the slice.
#[test]
fn kubernetes_endpoints_source_names_the_local_server_by_its_ip() {
    use kube_peer_proxy::config::MembershipSource;
    let parse = |json: &str| Config::parse(json.as_bytes()).expect(json);
    let c = parse(
        r#"{"local_cluster":"l","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"10.0.0.1:6443"}}"#,
    );
    let l = c.lease_discovery.clone().expect("lease_discovery");
    assert_eq!(l.source, MembershipSource::KubernetesEndpoints);
    assert_eq!(l.local_address.as_deref(), Some("10.0.0.1:6443"));
    assert_eq!((l.local_hostname, l.hosts, l.peer_port), (None, Vec::new(), None));
    assert_eq!(c.local_name, "10.0.0.1");
    let same = parse(
        r#"{"local_cluster":"l","local_name":"10.0.0.1","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"10.0.0.1:6443"}}"#,
    );
    assert_eq!(same, c);
    let v6 = parse(
        r#"{"local_cluster":"l","lease_discovery":{"source":"kubernetes_endpoints","cluster":"p","local_address":"[FD00:0:0::1]:6443","peer_port":6444}}"#,
    );
    assert_eq!(v6.local_name, "fd00::1", "canonical, as every peer writes it");
    assert_eq!(v6.lease_discovery.expect("lease_discovery").peer_port, Some(6444));
    // Absent means identity leases, today's behaviour; naming it changes nothing.
    let leases = r#"{"local_cluster":"l","lease_discovery":{"cluster":"p","local_hostname":"cp-1","local_address":"10.0.0.1:6443"}}"#;
    let default = parse(leases);
    assert_eq!(
        default.lease_discovery.as_ref().map(|l| l.source),
        Some(MembershipSource::IdentityLeases)
    );
    assert_eq!(default.local_name, "cp-1");
    let named = leases.replace(r#"{"cluster""#, r#"{"source":"identity_leases","cluster""#);
    assert_eq!(parse(&named), default);
}

#[test]
fn client_identity_config() {
    let c = Config::parse(
        br#"{"local_cluster":"local","client_identity":{"username_headers":["X-Remote-User"],
             "group_headers":["x-remote-group"],"extra_headers_prefixes":["X-Remote-Extra-"]}}"#,
    )
    .expect("client identity");
    let id = c.client_identity.expect("client_identity");
    assert_eq!(
        id,
        kube_peer_proxy::request::identity::RequestHeaderNames::default(),
        "kubeadm's names, lower-cased"
    );
    assert!(Config::parse(br#"{"local_cluster":"local"}"#)
        .expect("plain")
        .client_identity
        .is_none());
}
