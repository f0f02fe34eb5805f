//! Content negotiation for `/api` and `/apis` (spec §3.1, §4.2).
#![cfg(test)]

use kube_peer_proxy::accept::{negotiate, DiscoveryChoice};
use kube_peer_proxy::discovery::CONTENT_TYPE_V2;
use kube_peer_proxy::discovery_sync::DISCOVERY_ACCEPT;

use DiscoveryChoice::{Local, Merged, MergedLegacy};

struct Row {
    name: &'static str,
    accept: Option<&'static str>,
    want: DiscoveryChoice,
}

#[test]
fn accept_strings_of_real_clients() {
    let rows = [
        Row {
            name: "kubectl 1.26-1.29 (v2beta1 first; 1.33+ servers skip v2beta1 too)",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"),
            want: MergedLegacy,
        },
        Row {
            name: "kubectl 1.30-1.36",
            accept: Some(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
            ),
            want: Merged,
        },
        Row {
            name: "kubectl 1.37",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"),
            want: Merged,
        },
        Row {
            name: "client-go NoPeerDiscovery (profile=nopeer first)",
            accept: Some(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
            ),
            want: Local,
        },
        Row { name: "client-go UseLegacyDiscovery", accept: Some("application/json"), want: MergedLegacy },
        Row {
            name: "apiserver peer fetch",
            accept: Some(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
            ),
            want: Local,
        },
        Row {
            name: "kube-aggregator v2 only",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            want: Merged,
        },
        Row { name: "our own discovery fetch", accept: Some(DISCOVERY_ACCEPT), want: Local },
        Row { name: "the content type we serve", accept: Some(CONTENT_TYPE_V2), want: Merged },
    ];
    run(&rows);
}

#[test]
fn protobuf_and_fallbacks() {
    let rows = [
        Row {
            name: "protobuf first with a JSON v2 alternative",
            accept: Some(
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
            ),
            want: Merged,
        },
        Row {
            name: "protobuf v2 then legacy JSON only",
            accept: Some("application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"),
            want: MergedLegacy,
        },
        Row {
            name: "protobuf nopeer",
            accept: Some(
                "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ),
            want: Local,
        },
        Row { name: "no Accept header", accept: None, want: MergedLegacy },
        Row { name: "empty Accept header", accept: Some(""), want: MergedLegacy },
        Row { name: "*/*", accept: Some("*/*"), want: MergedLegacy },
        Row { name: "legacy protobuf", accept: Some("application/vnd.kubernetes.protobuf, */*"), want: MergedLegacy },
        Row {
            name: "unknown aggregated version is skipped",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            want: Merged,
        },
        Row {
            name: "only an unknown aggregated version",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList"),
            want: Local,
        },
        Row {
            name: "other profile value still merges",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=other"),
            want: Merged,
        },
        Row {
            name: "missing as= is not aggregated",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v2"),
            want: Local,
        },
        Row {
            name: "wrong group is not aggregated",
            accept: Some("application/json;g=example.com;v=v2;as=APIGroupDiscoveryList"),
            want: Local,
        },
        Row {
            name: "q parameter is ignored",
            accept: Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;q=0.9,application/json;q=0.8"),
            want: Merged,
        },
        Row {
            name: "leading empty clause",
            accept: Some(",application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            want: Merged,
        },
    ];
    run(&rows);
}

#[test]
fn parameter_order_and_whitespace_do_not_matter() {
    let rows = [
        Row {
            name: "v2 params reversed",
            accept: Some("application/json;as=APIGroupDiscoveryList;v=v2;g=apidiscovery.k8s.io"),
            want: Merged,
        },
        Row {
            name: "v2 with spaces",
            accept: Some("application/json ; g=apidiscovery.k8s.io ; v=v2 ; as=APIGroupDiscoveryList , application/json"),
            want: Merged,
        },
        Row {
            name: "v2 with spaces around =",
            accept: Some("application/json; g = apidiscovery.k8s.io; v = v2; as = APIGroupDiscoveryList"),
            want: Merged,
        },
        Row {
            name: "upper-case media type",
            accept: Some("Application/JSON;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            want: Merged,
        },
        Row {
            name: "nopeer first in parameter list",
            accept: Some("application/json;profile=nopeer;as=APIGroupDiscoveryList;g=apidiscovery.k8s.io;v=v2,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            want: Local,
        },
        Row {
            name: "nopeer with spaces",
            accept: Some("application/json; v=v2; profile = nopeer; g=apidiscovery.k8s.io; as=APIGroupDiscoveryList, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            want: Local,
        },
        Row {
            name: "v2beta1 reordered with spaces",
            accept: Some("application/json; as=APIGroupDiscoveryList; v=v2beta1; g=apidiscovery.k8s.io, application/json"),
            want: MergedLegacy,
        },
        Row {
            name: "1.30-1.36 string with spaces after commas",
            accept: Some(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList, application/json",
            ),
            want: Merged,
        },
    ];
    run(&rows);
}

fn run(rows: &[Row]) {
    for row in rows {
        assert_eq!(negotiate(row.accept), row.want, "{}: {:?}", row.name, row.accept);
    }
}
