//! RequestInfo classification (upstream `requestinfo.go`, docs/design.md): every row of the table, list-option handling, verbs,
//! odd paths, and a no-panic sweep.
#![cfg(test)]

mod common;

use kube_peer_proxy::request::request_info::{self, parse, NonResource, RequestKind};

use common::{non_resource as nr, resource_request as resource};

struct Row {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    want: RequestKind<'static>,
}

fn run(rows: &[Row]) {
    for row in rows {
        let got = parse(row.method, row.path);
        assert_eq!(got, row.want, "{}: {} {}", row.name, row.method, row.path);
    }
}

/// The grammar table, rows 1–34 (row numbers in the names).
#[test]
fn spec_table() {
    let rows = vec![
        Row {
            name: "1 /api",
            method: "GET",
            path: "/api",
            want: nr(NonResource::ApiRoot),
        },
        Row {
            name: "2 /api/v1",
            method: "GET",
            path: "/api/v1",
            want: nr(NonResource::CoreVersion("v1")),
        },
        Row {
            name: "3 /apis",
            method: "GET",
            path: "/apis",
            want: nr(NonResource::ApisRoot),
        },
        Row {
            name: "4 /apis/apps",
            method: "GET",
            path: "/apis/apps",
            want: nr(NonResource::Group("apps")),
        },
        Row {
            name: "5 /apis/apps/v1",
            method: "GET",
            path: "/apis/apps/v1",
            want: nr(NonResource::GroupVersion("apps", "v1")),
        },
        Row {
            name: "5 /apis/apps/v1/ (trailing slash)",
            method: "GET",
            path: "/apis/apps/v1/",
            want: nr(NonResource::GroupVersion("apps", "v1")),
        },
        Row {
            name: "6 /healthz",
            method: "GET",
            path: "/healthz",
            want: nr(NonResource::Other),
        },
        Row {
            name: "6 /version",
            method: "GET",
            path: "/version",
            want: nr(NonResource::Other),
        },
        Row {
            name: "6 /openapi/v3/apis/apps/v1",
            method: "GET",
            path: "/openapi/v3/apis/apps/v1",
            want: nr(NonResource::Other),
        },
        Row {
            name: "7 list namespaces",
            method: "GET",
            path: "/api/v1/namespaces",
            want: resource("list", "", "v1", "", "namespaces", "", ""),
        },
        Row {
            name: "8 get namespace",
            method: "GET",
            path: "/api/v1/namespaces/kube-system",
            want: resource("get", "", "v1", "kube-system", "namespaces", "kube-system", ""),
        },
        Row {
            name: "9 namespace finalize",
            method: "PUT",
            path: "/api/v1/namespaces/ns1/finalize",
            want: resource("update", "", "v1", "ns1", "namespaces", "ns1", "finalize"),
        },
        Row {
            name: "10 namespace status",
            method: "PATCH",
            path: "/api/v1/namespaces/ns1/status",
            want: resource("patch", "", "v1", "ns1", "namespaces", "ns1", "status"),
        },
        Row {
            name: "11 list pods all namespaces",
            method: "GET",
            path: "/api/v1/pods",
            want: resource("list", "", "v1", "", "pods", "", ""),
        },
        Row {
            name: "12 watch=true",
            method: "GET",
            path: "/api/v1/namespaces/ns1/pods?watch=true",
            want: resource("watch", "", "v1", "ns1", "pods", "", ""),
        },
        Row {
            name: "13 watch=0",
            method: "GET",
            path: "/api/v1/namespaces/ns1/pods?watch=0",
            want: resource("list", "", "v1", "ns1", "pods", "", ""),
        },
        Row {
            name: "14 legacy watch prefix collection",
            method: "GET",
            path: "/api/v1/watch/namespaces/ns1/pods",
            want: resource("watch", "", "v1", "ns1", "pods", "", ""),
        },
        Row {
            name: "15 legacy watch prefix object",
            method: "GET",
            path: "/api/v1/watch/namespaces/ns1/pods/p1",
            want: resource("watch", "", "v1", "ns1", "pods", "p1", ""),
        },
        Row {
            name: "16 get pod",
            method: "GET",
            path: "/api/v1/namespaces/ns1/pods/p1",
            want: resource("get", "", "v1", "ns1", "pods", "p1", ""),
        },
        Row {
            name: "16 HEAD pod",
            method: "HEAD",
            path: "/api/v1/namespaces/ns1/pods/p1",
            want: resource("get", "", "v1", "ns1", "pods", "p1", ""),
        },
        Row {
            name: "17 pod log",
            method: "GET",
            path: "/api/v1/namespaces/ns1/pods/p1/log",
            want: resource("get", "", "v1", "ns1", "pods", "p1", "log"),
        },
        Row {
            name: "18 POST exec",
            method: "POST",
            path: "/api/v1/namespaces/ns1/pods/p1/exec?command=ls",
            want: resource("create", "", "v1", "ns1", "pods", "p1", "exec"),
        },
        Row {
            name: "19 GET exec (websocket)",
            method: "GET",
            path: "/api/v1/namespaces/ns1/pods/p1/exec?command=ls",
            want: resource("get", "", "v1", "ns1", "pods", "p1", "exec"),
        },
        Row {
            name: "20 portforward",
            method: "POST",
            path: "/api/v1/namespaces/ns1/pods/p1/portforward",
            want: resource("create", "", "v1", "ns1", "pods", "p1", "portforward"),
        },
        Row {
            name: "21 pod proxy subresource with extra parts",
            method: "GET",
            path: "/api/v1/namespaces/ns1/pods/p1/proxy/metrics/x",
            want: resource("get", "", "v1", "ns1", "pods", "p1", "proxy"),
        },
        Row {
            name: "22 legacy proxy prefix",
            method: "GET",
            path: "/api/v1/proxy/namespaces/ns1/pods/p1/metrics",
            want: resource("proxy", "", "v1", "ns1", "pods", "p1", ""),
        },
        Row {
            name: "23 node proxy",
            method: "GET",
            path: "/api/v1/nodes/n1/proxy/stats",
            want: resource("get", "", "v1", "", "nodes", "n1", "proxy"),
        },
        Row {
            name: "24 create deployment",
            method: "POST",
            path: "/apis/apps/v1/namespaces/ns1/deployments",
            want: resource("create", "apps", "v1", "ns1", "deployments", "", ""),
        },
        Row {
            name: "25 update scale",
            method: "PUT",
            path: "/apis/apps/v1/namespaces/ns1/deployments/d1/scale",
            want: resource("update", "apps", "v1", "ns1", "deployments", "d1", "scale"),
        },
        Row {
            name: "26 deletecollection",
            method: "DELETE",
            path: "/apis/apps/v1/namespaces/ns1/deployments",
            want: resource("deletecollection", "apps", "v1", "ns1", "deployments", "", ""),
        },
        Row {
            name: "27 delete",
            method: "DELETE",
            path: "/apis/apps/v1/namespaces/ns1/deployments/d1",
            want: resource("delete", "apps", "v1", "ns1", "deployments", "d1", ""),
        },
        Row {
            name: "28 labelSelector does not set a name",
            method: "GET",
            path: "/apis/apps/v1/deployments?labelSelector=app%3Dx",
            want: resource("list", "apps", "v1", "", "deployments", "", ""),
        },
        Row {
            name: "29 fieldSelector metadata.name sets the name",
            method: "GET",
            path: "/apis/apps/v1/namespaces/ns1/deployments?fieldSelector=metadata.name%3Dd1",
            want: resource("list", "apps", "v1", "ns1", "deployments", "d1", ""),
        },
        Row {
            name: "30 legacy watch prefix in a group",
            method: "GET",
            path: "/apis/apps/v1/watch/deployments",
            want: resource("watch", "apps", "v1", "", "deployments", "", ""),
        },
        Row {
            name: "31 CRD status",
            method: "GET",
            path: "/apis/stable.example.com/v1/namespaces/ns1/crontabs/c1/status",
            want: resource("get", "stable.example.com", "v1", "ns1", "crontabs", "c1", "status"),
        },
        Row {
            name: "32 CRD object with dots in its name",
            method: "GET",
            path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/crontabs.stable.example.com",
            want: resource(
                "get",
                "apiextensions.k8s.io",
                "v1",
                "",
                "customresourcedefinitions",
                "crontabs.stable.example.com",
                "",
            ),
        },
        Row {
            name: "33 resource.k8s.io v1beta2",
            method: "GET",
            path: "/apis/resource.k8s.io/v1beta2/resourceclaims",
            want: resource("list", "resource.k8s.io", "v1beta2", "", "resourceclaims", "", ""),
        },
        Row {
            name: "34 /api/v1/watch",
            method: "GET",
            path: "/api/v1/watch",
            want: RequestKind::Invalid,
        },
    ];
    assert_eq!(rows.len(), 38, "34 spec rows plus 4 variants");
    run(&rows);
}

#[test]
fn watch_query_values() {
    struct W {
        desc: &'static str,
        query: &'static str,
        verb: &'static str,
    }
    let rows = [
        W {
            desc: "true",
            query: "?watch=true",
            verb: "watch",
        },
        W {
            desc: "1",
            query: "?watch=1",
            verb: "watch",
        },
        W {
            desc: "0",
            query: "?watch=0",
            verb: "list",
        },
        W {
            desc: "false",
            query: "?watch=false",
            verb: "list",
        },
        W {
            desc: "FALSE (case-insensitive)",
            query: "?watch=FALSE",
            verb: "list",
        },
        W {
            desc: "False",
            query: "?watch=False",
            verb: "list",
        },
        W {
            desc: "empty value is true",
            query: "?watch=",
            verb: "watch",
        },
        W {
            desc: "key without = is true",
            query: "?watch",
            verb: "watch",
        },
        W {
            desc: "missing",
            query: "",
            verb: "list",
        },
        W {
            desc: "other params only",
            query: "?limit=500&resourceVersion=0",
            verb: "list",
        },
        W {
            desc: "any other value is true",
            query: "?watch=yes",
            verb: "watch",
        },
        W {
            desc: "first occurrence wins (false)",
            query: "?watch=false&watch=true",
            verb: "list",
        },
        W {
            desc: "first occurrence wins (true)",
            query: "?watch=true&watch=false",
            verb: "watch",
        },
        W {
            desc: "among other params",
            query: "?resourceVersion=10&watch=1&allowWatchBookmarks=true",
            verb: "watch",
        },
        W {
            desc: "percent-encoded key",
            query: "?%77atch=true",
            verb: "watch",
        },
        W {
            desc: "? only",
            query: "?",
            verb: "list",
        },
        W {
            desc: "empty pairs",
            query: "?&&watch=1&",
            verb: "watch",
        },
    ];
    for row in rows {
        let path = format!("/api/v1/namespaces/ns1/pods{}", row.query);
        match parse("GET", &path) {
            RequestKind::Resource(r) => {
                assert_eq!(r.verb, row.verb, "{}", row.desc);
                assert_eq!(r.resource, "pods", "{}", row.desc);
                assert_eq!(r.name, "", "{}", row.desc);
            }
            other => panic!("{}: {other:?}", row.desc),
        }
    }
}

#[test]
fn watch_query_does_not_apply_to_named_or_non_get_requests() {
    // Only a nameless GET consults list options.
    assert_eq!(
        parse("GET", "/api/v1/namespaces/ns1/pods/p1?watch=true"),
        resource("get", "", "v1", "ns1", "pods", "p1", "")
    );
    assert_eq!(
        parse("DELETE", "/api/v1/namespaces/ns1/pods?watch=true"),
        resource("deletecollection", "", "v1", "ns1", "pods", "", "")
    );
    assert_eq!(
        parse("POST", "/api/v1/namespaces/ns1/pods?watch=true"),
        resource("create", "", "v1", "ns1", "pods", "", "")
    );
}

#[test]
fn field_selector_name() {
    struct F {
        desc: &'static str,
        query: &'static str,
        verb: &'static str,
        name: &'static str,
    }
    let rows = [
        F {
            desc: "encoded =",
            query: "?fieldSelector=metadata.name%3Dd1",
            verb: "list",
            name: "d1",
        },
        F {
            desc: "raw ==",
            query: "?fieldSelector=metadata.name==x",
            verb: "list",
            name: "x",
        },
        F {
            desc: "encoded ==",
            query: "?fieldSelector=metadata.name%3D%3Dx",
            verb: "list",
            name: "x",
        },
        F {
            desc: "raw =",
            query: "?fieldSelector=metadata.name=x",
            verb: "list",
            name: "x",
        },
        F {
            desc: "among other terms",
            query: "?fieldSelector=status.phase%3DRunning%2Cmetadata.name%3Dp1",
            verb: "list",
            name: "p1",
        },
        F {
            desc: "with watch",
            query: "?watch=1&fieldSelector=metadata.name%3Dp1",
            verb: "watch",
            name: "p1",
        },
        F {
            desc: "!= is not exact",
            query: "?fieldSelector=metadata.name!%3Dx",
            verb: "list",
            name: "",
        },
        F {
            desc: "other field",
            query: "?fieldSelector=metadata.namespace%3Dx",
            verb: "list",
            name: "",
        },
        F {
            desc: "=== is not a selector",
            query: "?fieldSelector=metadata.name%3D%3D%3Dx",
            verb: "list",
            name: "",
        },
        F {
            desc: "invalid path segment ..",
            query: "?fieldSelector=metadata.name%3D..",
            verb: "list",
            name: "",
        },
        F {
            desc: "invalid path segment .",
            query: "?fieldSelector=metadata.name%3D.",
            verb: "list",
            name: "",
        },
        F {
            desc: "invalid path segment with /",
            query: "?fieldSelector=metadata.name%3Da%2Fb",
            verb: "list",
            name: "",
        },
        F {
            desc: "invalid path segment with %",
            query: "?fieldSelector=metadata.name%3Da%25b",
            verb: "list",
            name: "",
        },
        F {
            desc: "empty value",
            query: "?fieldSelector=metadata.name%3D",
            verb: "list",
            name: "",
        },
        F {
            desc: "first fieldSelector wins",
            query: "?fieldSelector=metadata.name%3Da&fieldSelector=metadata.name%3Db",
            verb: "list",
            name: "a",
        },
    ];
    for row in rows {
        let path = format!("/api/v1/namespaces/ns1/pods{}", row.query);
        match parse("GET", &path) {
            RequestKind::Resource(r) => {
                assert_eq!((r.verb, r.name.as_ref()), (row.verb, row.name), "{}", row.desc);
            }
            other => panic!("{}: {other:?}", row.desc),
        }
    }
}

#[test]
fn methods_map_to_verbs() {
    struct M {
        method: &'static str,
        verb: &'static str,
    }
    let object = "/apis/apps/v1/namespaces/ns1/deployments/d1";
    let rows = [
        M {
            method: "GET",
            verb: "get",
        },
        M {
            method: "get",
            verb: "get",
        },
        M {
            method: "HEAD",
            verb: "get",
        },
        M {
            method: "POST",
            verb: "create",
        },
        M {
            method: "PUT",
            verb: "update",
        },
        M {
            method: "PATCH",
            verb: "patch",
        },
        M {
            method: "DELETE",
            verb: "delete",
        },
        M {
            method: "OPTIONS",
            verb: "",
        },
        M {
            method: "CONNECT",
            verb: "",
        },
        M { method: "", verb: "" },
    ];
    for row in rows {
        match parse(row.method, object) {
            RequestKind::Resource(r) => assert_eq!(r.verb, row.verb, "method {:?}", row.method),
            other => panic!("{}: {other:?}", row.method),
        }
    }
    // HEAD on a collection is a list, OPTIONS on a collection stays "" (no list options).
    assert_eq!(
        parse("HEAD", "/apis/apps/v1/deployments"),
        resource("list", "apps", "v1", "", "deployments", "", "")
    );
    assert_eq!(
        parse("OPTIONS", "/apis/apps/v1/deployments?watch=1"),
        resource("", "apps", "v1", "", "deployments", "", "")
    );
    // The path prefix verbs win over the method.
    assert_eq!(
        parse("POST", "/api/v1/watch/pods"),
        resource("watch", "", "v1", "", "pods", "", "")
    );
}

#[test]
fn odd_paths() {
    let rows = vec![
        Row {
            name: "empty path",
            method: "GET",
            path: "",
            want: nr(NonResource::Other),
        },
        Row {
            name: "root",
            method: "GET",
            path: "/",
            want: nr(NonResource::Other),
        },
        Row {
            name: "/api/",
            method: "GET",
            path: "/api/",
            want: nr(NonResource::ApiRoot),
        },
        Row {
            name: "/apis/",
            method: "GET",
            path: "/apis/",
            want: nr(NonResource::ApisRoot),
        },
        Row {
            name: "double leading slash",
            method: "GET",
            path: "//api",
            want: nr(NonResource::ApiRoot),
        },
        Row {
            name: "/api?x",
            method: "GET",
            path: "/api?timeout=32s",
            want: nr(NonResource::ApiRoot),
        },
        Row {
            name: "/api/v1/ trailing",
            method: "GET",
            path: "/api/v1/",
            want: nr(NonResource::CoreVersion("v1")),
        },
        Row {
            name: "/apis/apps/",
            method: "GET",
            path: "/apis/apps/",
            want: nr(NonResource::Group("apps")),
        },
        Row {
            name: "/apis/apps/v1?q",
            method: "GET",
            path: "/apis/apps/v1?timeout=32s",
            want: nr(NonResource::GroupVersion("apps", "v1")),
        },
        Row {
            name: "/apiss",
            method: "GET",
            path: "/apiss/apps/v1/x",
            want: nr(NonResource::Other),
        },
        Row {
            name: "/API is case-sensitive",
            method: "GET",
            path: "/API/v1/pods",
            want: nr(NonResource::Other),
        },
        Row {
            name: "/api/v1/a/b/c/d",
            method: "GET",
            path: "/api/v1/a/b/c/d",
            want: resource("get", "", "v1", "", "a", "b", "c"),
        },
        Row {
            name: "trailing slash on a collection",
            method: "GET",
            path: "/api/v1/pods/",
            want: resource("list", "", "v1", "", "pods", "", ""),
        },
        Row {
            name: "trailing slash on an object",
            method: "GET",
            path: "/apis/apps/v1/namespaces/ns1/deployments/d1/",
            want: resource("get", "apps", "v1", "ns1", "deployments", "d1", ""),
        },
        Row {
            name: "empty segment is kept like Go's strings.Split",
            method: "GET",
            path: "/api/v1//pods",
            want: resource("get", "", "v1", "", "", "pods", ""),
        },
        Row {
            name: "empty namespace segment",
            method: "GET",
            path: "/api/v1/namespaces//pods",
            want: resource("list", "", "v1", "", "pods", "", ""),
        },
        Row {
            name: "parse takes a decoded path: escapes are data here (parse_decoded decodes, see request_info_upstream.rs)",
            method: "GET",
            path: "/api/v1/namespaces/ns%2F1/pods/p%201",
            want: resource("get", "", "v1", "ns%2F1", "pods", "p%201", ""),
        },
        Row {
            name: "parse takes a decoded path: an escaped resource is data here",
            method: "GET",
            path: "/apis/apps/v1/deploy%6Dents",
            want: resource("list", "apps", "v1", "", "deploy%6Dents", "", ""),
        },
        Row {
            name: "CRD group with many dots",
            method: "DELETE",
            path: "/apis/a.b.c.example.io/v1alpha1/namespaces/x/widgets/w.1",
            want: resource("delete", "a.b.c.example.io", "v1alpha1", "x", "widgets", "w.1", ""),
        },
        Row {
            name: "namespace alone under a group",
            method: "GET",
            path: "/apis/apps/v1/namespaces/ns1",
            want: resource("get", "apps", "v1", "ns1", "namespaces", "ns1", ""),
        },
        Row {
            name: "proxy without more parts",
            method: "GET",
            path: "/api/v1/proxy",
            want: RequestKind::Invalid,
        },
        Row {
            name: "/apis/g/v/watch",
            method: "GET",
            path: "/apis/apps/v1/watch",
            want: RequestKind::Invalid,
        },
        Row {
            name: "/api/v1/watch/",
            method: "GET",
            path: "/api/v1/watch/",
            want: RequestKind::Invalid,
        },
        Row {
            name: "legacy proxy has no subresource",
            method: "GET",
            path: "/api/v1/proxy/nodes/n1/stats/summary",
            want: resource("proxy", "", "v1", "", "nodes", "n1", ""),
        },
        Row {
            name: "unicode segments",
            method: "GET",
            path: "/apis/ü.example/v1/namespaces/ñ/things/日本",
            want: resource("get", "ü.example", "v1", "ñ", "things", "日本", ""),
        },
    ];
    run(&rows);
}

#[test]
fn split_path_separates_the_query() {
    assert_eq!(
        request_info::split_path("/api/v1/pods?watch=1&x=y"),
        ("/api/v1/pods", "watch=1&x=y")
    );
    assert_eq!(request_info::split_path("/api/v1/pods"), ("/api/v1/pods", ""));
    assert_eq!(request_info::split_path("/api?"), ("/api", ""));
    assert_eq!(request_info::split_path("/a?b?c"), ("/a", "b?c"));
}

#[test]
fn percent_decode_query_semantics() {
    struct P {
        input: &'static str,
        want: &'static str,
    }
    let rows = [
        P {
            input: "metadata.name%3Dd1",
            want: "metadata.name=d1",
        },
        P {
            input: "a+b",
            want: "a b",
        },
        P {
            input: "%41%62",
            want: "Ab",
        },
        P { input: "%", want: "%" },
        P {
            input: "%4",
            want: "%4",
        },
        P {
            input: "%zz",
            want: "%zz",
        },
        P {
            input: "100%",
            want: "100%",
        },
        P {
            input: "%E2%82%AC",
            want: "€",
        },
        P {
            input: "%E2%82",
            want: "\u{FFFD}",
        },
        P {
            input: "%é",
            want: "%é",
        },
        P { input: "", want: "" },
    ];
    for row in rows {
        assert_eq!(request_info::percent_decode(row.input), row.want, "{:?}", row.input);
    }
}

#[test]
fn never_panics_on_garbage() {
    let long_path = format!(
        "/api/v1/namespaces/{}/pods/{}",
        "n".repeat(100_000),
        "p/".repeat(20_000)
    );
    let long_query = format!("/api/v1/pods?{}", "watch=1&fieldSelector=%%%&".repeat(10_000));
    let many_slashes = "/".repeat(50_000);
    let inputs: Vec<String> = vec![
        String::new(),
        "?".into(),
        "??".into(),
        "?watch".into(),
        "/?".into(),
        "/api?".into(),
        "/api/v1/pods?".into(),
        "/api/v1/pods?%".into(),
        "/api/v1/pods?watch=%".into(),
        "/api/v1/pods?watch=%E2".into(),
        "/api/v1/pods?fieldSelector=%".into(),
        "/api/v1/pods?fieldSelector=metadata.name%3D%FF%FE".into(),
        "/api/v1/pods?fieldSelector=,,,metadata.name".into(),
        "/api/v1/pods?fieldSelector=metadata.name".into(),
        "/api/v1/pods?=&=&&=".into(),
        "/api/v1/pods?watch=é&fieldSelector=metadata.name=日本".into(),
        "/api/v1/namespaces".into(),
        "/api/v1/namespaces/".into(),
        "/apis/a/b/namespaces".into(),
        "/apis/a/b/proxy".into(),
        "/apis/a/b/watch/namespaces".into(),
        "/apis/a/b/watch/namespaces/x".into(),
        "/apis///".into(),
        "/apis////".into(),
        "/api//".into(),
        "/api///x".into(),
        "////api////v1////".into(),
        "api/v1/pods".into(),
        "/\u{0}/\u{7f}".into(),
        "/api/v1/\u{0}".into(),
        "/🦀/🦀/🦀/🦀/🦀/🦀".into(),
        "/apis/🦀/🦀/🦀/🦀/🦀".into(),
        "/api/v1/pods?🦀=🦀".into(),
        "%2Fapi%2Fv1%2Fpods".into(),
        "/api/v1/pods#fragment".into(),
        long_path,
        long_query,
        many_slashes,
        "/api/v1/".repeat(10_000),
    ];
    let methods = [
        "GET", "HEAD", "OPTIONS", "POST", "DELETE", "", "gEt", "BREW", "\u{fffd}",
    ];
    for input in &inputs {
        for method in methods {
            let _ = parse(method, input);
        }
    }
}
