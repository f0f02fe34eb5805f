//! Content negotiation for `/api` and `/apis` (upstream `aggregated/wrapper.go` and `negotiation/negotiate.go`, docs/design.md).
#![cfg(test)]

use kube_peer_proxy::discovery::documents::CONTENT_TYPE_V2;
use kube_peer_proxy::discovery::sync::DISCOVERY_ACCEPT;
use kube_peer_proxy::request::accept::{negotiate, DiscoveryChoice};

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
            name: "upper-case media type: goautoneg compares as written, no serializer matches (406 upstream)",
            accept: Some("Application/JSON;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            want: Local,
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

/// `NegotiateMediaTypeOptions` semantics (k8s.io/apiserver v0.36.3 with goautoneg): quality order,
/// wildcards, q=0, YAML, conversions the endpoint refuses.
#[test]
fn quality_and_wildcards_like_upstream() {
    const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    let rows: Vec<(&str, String, DiscoveryChoice)> = vec![
        (
            "the issue's example: JSON q=0.5 loses to v2 at q=1",
            format!("application/json;q=0.5, {V2}"),
            Merged,
        ),
        (
            "v2 at lower quality still wins: plain JSON is no aggregated match, the loop goes on",
            format!("{V2};q=0.5, application/json"),
            Merged,
        ),
        (
            "equal quality keeps the written order",
            format!("application/json, {V2}"),
            Merged,
        ),
        (
            "aggregated wins whenever some clause asks for it (the discovery restrictions refuse plain JSON)",
            format!("application/json;q=0.9, {V2};q=0.1"),
            Merged,
        ),
        (
            "q=0 is still a clause in 1.36 (rejected only in later releases)",
            format!("{V2};q=0"),
            Merged,
        ),
        (
            "unparseable q counts as 0 (and still aggregated wins)",
            format!("{V2};q=abc, application/json"),
            Merged,
        ),
        ("*/* alone: JSON, legacy", "*/*".to_string(), MergedLegacy),
        ("* alone is */*", "*".to_string(), MergedLegacy),
        (
            "application/* with the v2 conversion",
            "application/*;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_string(),
            Merged,
        ),
        (
            "*/* with the v2 conversion",
            "*/*;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_string(),
            Merged,
        ),
        (
            "a concrete type sorts before */* of higher quality (goautoneg's Less)",
            format!("*/*;q=0.9, {V2};q=0.8"),
            Merged,
        ),
        (
            "YAML legacy: only the local server writes YAML",
            "application/yaml".to_string(),
            Local,
        ),
        (
            "YAML before JSON: we answer the JSON the client also takes",
            "application/yaml, application/json".to_string(),
            MergedLegacy,
        ),
        (
            "YAML aggregated, then JSON aggregated: we answer the JSON one",
            format!("application/yaml;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, {V2}"),
            Merged,
        ),
        (
            "protobuf aggregated only: the local server",
            "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList".to_string(),
            Local,
        ),
        (
            "v2beta1 is not aggregated on 1.33+: legacy JSON next",
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList, application/json".to_string(),
            MergedLegacy,
        ),
        (
            "a conversion the endpoint refuses (Table) is skipped",
            "application/json;as=Table;v=v1;g=meta.k8s.io, application/json".to_string(),
            MergedLegacy,
        ),
        ("sv is never allowed", "application/json;sv=v1".to_string(), Local),
        (
            "stream=watch with JSON is allowed",
            "application/json;stream=watch".to_string(),
            MergedLegacy,
        ),
        (
            "stream=watch with YAML is not (no stream serializer)",
            "application/yaml;stream=watch, application/json".to_string(),
            MergedLegacy,
        ),
        (
            "nopeer on a legacy clause: the local view",
            "application/json;profile=nopeer".to_string(),
            Local,
        ),
        (
            "nothing acceptable: 406 from the local server",
            "text/html".to_string(),
            Local,
        ),
        (
            "quoted parameter values are not unquoted",
            "application/json;g=\"apidiscovery.k8s.io\";v=v2;as=APIGroupDiscoveryList, application/json".to_string(),
            MergedLegacy,
        ),
        (
            "spaces around parameters",
            "application/json ; g=apidiscovery.k8s.io ; v=v2 ; as=APIGroupDiscoveryList".to_string(),
            Merged,
        ),
    ];
    for (why, accept, want) in rows {
        assert_eq!(negotiate(Some(&accept)), want, "{why}: {accept}");
    }
}

#[test]
fn parse_accept_orders_like_goautoneg() {
    use kube_peer_proxy::request::accept::parse_accept;
    let kinds = |h: &str| -> Vec<String> {
        parse_accept(h)
            .iter()
            .map(|c| format!("{}/{};q={:.2}", c.kind, c.sub, c.q))
            .collect()
    };
    // Go's insertion sort with goautoneg's Less: q=0.9 */* moves before q=0.5 a/b.
    assert_eq!(
        kinds("a/b;q=0.5, c/d, */*;q=0.9"),
        ["c/d/;q=1.00", "*/*;q=0.90", "a/b;q=0.50"].map(|s| s.replace("c/d/", "c/d"))
    );
    assert_eq!(kinds("a/*, a/b"), ["a/b;q=1.00", "a/*;q=1.00"]);
    assert_eq!(kinds("noslash, a/b/c, x/y"), ["x/y;q=1.00"]);
    assert_eq!(kinds(""), Vec::<String>::new());
}
