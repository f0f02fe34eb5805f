//! Grammar parity with upstream's own RequestInfo tests.
//!
//! Source read: k8s.io/apiserver `pkg/endpoints/request/requestinfo_test.go` (and `requestinfo.go`),
//! repository github.com/kubernetes/apiserver, tag `v0.37.0-beta.0` (commit
//! c19df515293eb2c814ee3cca7c46e5c2748e789f, Kubernetes 1.37 beta); master at
//! 24a394e516bfda066d7e2221d7d92c052de27c54 has an identical `pkg/endpoints/request/`. The test file is
//! also unchanged since `v0.36.0` (1.36 differs only in `requestinfo.go`'s removed AuthorizeWithSelectors
//! gate, which touches the FieldSelector/LabelSelector fields we do not model).
//! Field-selector grammar: k8s.io/apimachinery `pkg/fields/selector.go` / `selector_test.go`, master
//! eed236ceee2c19c2753a3d93ac0631dc20750454.
//!
//! Every case of `TestGetAPIRequestInfo` (30 success cases + 6 "error" cases, which upstream asserts are
//! *non-resource* requests, not errors), `TestGetNonAPIRequestInfo` (13) and `TestSelectorParsing` (12; the
//! 1.30 `TestFieldSelectorParsing` cases are a subset of it) is translated below. Upstream's resolver is
//! `newTestRequestInfoResolver()` = `APIPrefixes {"api","apis"}`, `GrouplessAPIPrefixes {"api"}`, which is
//! kube-apiserver's configuration and the only one our parser implements, so **no case is skipped**.
//! None of these upstream cases makes `NewRequestInfo` return an error ("unable to determine kind and
//! namespace from url"), so no row expects `RequestKind::Invalid` (the "proxy without more parts" row covers that in
//! `tests/request_info.rs`).
//!
//! Translation notes:
//! * Upstream checks `IsResourceRequest`, verb, version, namespace, resource, subresource, name and `Parts`
//!   (and group implicitly through the path). Our `ResourceRequest` has no `Parts`; the parts beyond
//!   `resource/name/subresource` (e.g. `subpath/not/a/subresource` under `proxy`) are not observable, the
//!   rest of `Parts` is covered by resource/name/subresource.
//! * Upstream's rows for `/apis/extensions/...` list `expectedAPIPrefix` "api" — a typo upstream never
//!   asserts (the prefix is not compared); we assert the group `extensions` instead.
//! * Non-resource results are mapped to our discovery classification (`/api/version` → `CoreVersion`,
//!   `/apis/<g>/<v>` → `GroupVersion`, other → `Other`); upstream only asserts "not a resource request".
//! * `TestSelectorParsing` also checks the raw `FieldSelector`/`LabelSelector` copies, which we do not model;
//!   its name and verb expectations are asserted. Its "invalid selector with metadata.name" cases found a
//!   bug: we used to pick `metadata.name=name1` out of the unparseable `metadata.name=name1,foo`; upstream's
//!   `fields.ParseSelector` fails, the list-options decode fails and `Name` stays empty.
//!   `src/request/request_info.rs` now ports `fields.ParseSelector` + `RequiresExactMatch` (see the second test).
//!
//! Percent-encoding: Go's `NewRequestInfo` splits `req.URL.Path`, which `net/url` has already
//! percent-decoded (an invalid `%` escape in the path makes Go's server reject the request with 400 before
//! any handler). None of the upstream cases above has a `%` in its path; `parse_decoded` (what the
//! routing decision uses) classifies the decoded path like upstream, and the rows of
//! `percent_encoded_paths_are_classified_decoded` below pin that down: encoded letters, `%2F` as a
//! segment separator, a decoded `?` that stays in the path, and invalid escapes.
//! Query strings are decoded by both (`req.URL.Query()` upstream, `percent_decode` here).
#![cfg(test)]

mod common;

use kube_peer_proxy::request::request_info::{parse, NonResource, RequestKind};

struct Row {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    want: RequestKind<'static>,
}

fn row(name: &'static str, method: &'static str, path: &'static str, want: RequestKind<'static>) -> Row {
    Row {
        name,
        method,
        path,
        want,
    }
}

use common::{non_resource as nr, resource_request as res};

fn run(rows: &[Row]) {
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let got = parse(r.method, r.path);
            (got != r.want).then(|| {
                format!(
                    "{}: {} {:?}\n   got {:?}\n  want {:?}",
                    r.name, r.method, r.path, got, r.want
                )
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} rows differ:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

/// `TestGetAPIRequestInfo`, `TestGetNonAPIRequestInfo` and `TestSelectorParsing`, every case, in upstream
/// order. `TestGetAPIRequestInfo` success cases are unnamed upstream: they are named after the section
/// comment they sit under plus their index in `successCases`.
#[test]
fn upstream_request_info_cases() {
    let rows = vec![
        // ---- TestGetAPIRequestInfo successCases: "resource paths"
        row(
            "TestGetAPIRequestInfo/resource paths#0",
            "GET",
            "/api/v1/namespaces",
            res("list", "", "v1", "", "namespaces", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/resource paths#1",
            "GET",
            "/api/v1/namespaces/other",
            res("get", "", "v1", "other", "namespaces", "other", ""),
        ),
        row(
            "TestGetAPIRequestInfo/resource paths#2",
            "GET",
            "/api/v1/namespaces/other/pods",
            res("list", "", "v1", "other", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/resource paths#3",
            "GET",
            "/api/v1/namespaces/other/pods/foo",
            res("get", "", "v1", "other", "pods", "foo", ""),
        ),
        row(
            "TestGetAPIRequestInfo/resource paths#4 HEAD",
            "HEAD",
            "/api/v1/namespaces/other/pods/foo",
            res("get", "", "v1", "other", "pods", "foo", ""),
        ),
        row("TestGetAPIRequestInfo/resource paths#5", "GET", "/api/v1/pods", res("list", "", "v1", "", "pods", "", "")),
        row(
            "TestGetAPIRequestInfo/resource paths#6 HEAD",
            "HEAD",
            "/api/v1/pods",
            res("list", "", "v1", "", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/resource paths#7 (duplicate of #3 upstream)",
            "GET",
            "/api/v1/namespaces/other/pods/foo",
            res("get", "", "v1", "other", "pods", "foo", ""),
        ),
        row(
            "TestGetAPIRequestInfo/resource paths#8 (duplicate of #2 upstream)",
            "GET",
            "/api/v1/namespaces/other/pods",
            res("list", "", "v1", "other", "pods", "", ""),
        ),
        // ---- "special verbs"
        row(
            "TestGetAPIRequestInfo/special verbs#9 proxy",
            "GET",
            "/api/v1/proxy/namespaces/other/pods/foo",
            res("proxy", "", "v1", "other", "pods", "foo", ""),
        ),
        row(
            "TestGetAPIRequestInfo/special verbs#10 proxy subpath is not a subresource",
            "GET",
            "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource",
            res("proxy", "", "v1", "other", "pods", "foo", ""),
        ),
        row(
            "TestGetAPIRequestInfo/special verbs#11 watch prefix",
            "GET",
            "/api/v1/watch/pods",
            res("watch", "", "v1", "", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/special verbs#12 watch=true",
            "GET",
            "/api/v1/pods?watch=true",
            res("watch", "", "v1", "", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/special verbs#13 watch=false",
            "GET",
            "/api/v1/pods?watch=false",
            res("list", "", "v1", "", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/special verbs#14 namespaced watch prefix",
            "GET",
            "/api/v1/watch/namespaces/other/pods",
            res("watch", "", "v1", "other", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/special verbs#15 watch=1",
            "GET",
            "/api/v1/namespaces/other/pods?watch=1",
            res("watch", "", "v1", "other", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/special verbs#16 watch=0",
            "GET",
            "/api/v1/namespaces/other/pods?watch=0",
            res("list", "", "v1", "other", "pods", "", ""),
        ),
        // ---- "subresource identification"
        row(
            "TestGetAPIRequestInfo/subresource identification#17 status",
            "GET",
            "/api/v1/namespaces/other/pods/foo/status",
            res("get", "", "v1", "other", "pods", "foo", "status"),
        ),
        row(
            "TestGetAPIRequestInfo/subresource identification#18 proxy subresource",
            "GET",
            "/api/v1/namespaces/other/pods/foo/proxy/subpath",
            res("get", "", "v1", "other", "pods", "foo", "proxy"),
        ),
        row(
            "TestGetAPIRequestInfo/subresource identification#19 namespace finalize",
            "PUT",
            "/api/v1/namespaces/other/finalize",
            res("update", "", "v1", "other", "namespaces", "other", "finalize"),
        ),
        row(
            "TestGetAPIRequestInfo/subresource identification#20 namespace status",
            "PUT",
            "/api/v1/namespaces/other/status",
            res("update", "", "v1", "other", "namespaces", "other", "status"),
        ),
        // ---- "verb identification"
        row(
            "TestGetAPIRequestInfo/verb identification#21 PATCH",
            "PATCH",
            "/api/v1/namespaces/other/pods/foo",
            res("patch", "", "v1", "other", "pods", "foo", ""),
        ),
        row(
            "TestGetAPIRequestInfo/verb identification#22 DELETE",
            "DELETE",
            "/api/v1/namespaces/other/pods/foo",
            res("delete", "", "v1", "other", "pods", "foo", ""),
        ),
        row(
            "TestGetAPIRequestInfo/verb identification#23 POST",
            "POST",
            "/api/v1/namespaces/other/pods",
            res("create", "", "v1", "other", "pods", "", ""),
        ),
        // ---- "deletecollection verb identification"
        row(
            "TestGetAPIRequestInfo/deletecollection verb identification#24 nodes",
            "DELETE",
            "/api/v1/nodes",
            res("deletecollection", "", "v1", "", "nodes", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/deletecollection verb identification#25 namespaces",
            "DELETE",
            "/api/v1/namespaces",
            res("deletecollection", "", "v1", "", "namespaces", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/deletecollection verb identification#26 namespaced pods",
            "DELETE",
            "/api/v1/namespaces/other/pods",
            res("deletecollection", "", "v1", "other", "pods", "", ""),
        ),
        row(
            "TestGetAPIRequestInfo/deletecollection verb identification#27 group",
            "DELETE",
            "/apis/extensions/v1/namespaces/other/pods",
            res("deletecollection", "extensions", "v1", "other", "pods", "", ""),
        ),
        // ---- "api group identification"
        row(
            "TestGetAPIRequestInfo/api group identification#28",
            "POST",
            "/apis/extensions/v1/namespaces/other/pods",
            res("create", "extensions", "v1", "other", "pods", "", ""),
        ),
        // ---- "api version identification"
        row(
            "TestGetAPIRequestInfo/api version identification#29",
            "POST",
            "/apis/extensions/v1beta3/namespaces/other/pods",
            res("create", "extensions", "v1beta3", "other", "pods", "", ""),
        ),
        // ---- TestGetAPIRequestInfo errorCases (upstream: no error, IsResourceRequest == false)
        row("TestGetAPIRequestInfo/errorCases/no resource path", "GET", "/", nr(NonResource::Other)),
        row(
            "TestGetAPIRequestInfo/errorCases/just apiversion",
            "GET",
            "/api/version/",
            nr(NonResource::CoreVersion("version")),
        ),
        row(
            "TestGetAPIRequestInfo/errorCases/just prefix, group, version",
            "GET",
            "/apis/group/version/",
            nr(NonResource::GroupVersion("group", "version")),
        ),
        row(
            "TestGetAPIRequestInfo/errorCases/apiversion with no resource",
            "GET",
            "/api/version/",
            nr(NonResource::CoreVersion("version")),
        ),
        row(
            "TestGetAPIRequestInfo/errorCases/bad prefix",
            "GET",
            "/badprefix/version/resource",
            nr(NonResource::Other),
        ),
        row(
            "TestGetAPIRequestInfo/errorCases/missing api group",
            "GET",
            "/apis/version/resource",
            nr(NonResource::GroupVersion("version", "resource")),
        ),
        // ---- TestGetNonAPIRequestInfo (all GET; `expected` = IsResourceRequest)
        row(
            "TestGetNonAPIRequestInfo/simple groupless",
            "GET",
            "/api/version/resource",
            res("list", "", "version", "", "resource", "", ""),
        ),
        row(
            "TestGetNonAPIRequestInfo/simple group",
            "GET",
            "/apis/group/version/resource/name/subresource",
            res("get", "group", "version", "", "resource", "name", "subresource"),
        ),
        row(
            "TestGetNonAPIRequestInfo/more steps",
            "GET",
            "/api/version/resource/name/subresource",
            res("get", "", "version", "", "resource", "name", "subresource"),
        ),
        row(
            "TestGetNonAPIRequestInfo/group list",
            "GET",
            "/apis/batch/v1/job",
            res("list", "batch", "v1", "", "job", "", ""),
        ),
        row(
            "TestGetNonAPIRequestInfo/group get",
            "GET",
            "/apis/batch/v1/job/foo",
            res("get", "batch", "v1", "", "job", "foo", ""),
        ),
        row(
            "TestGetNonAPIRequestInfo/group subresource",
            "GET",
            "/apis/batch/v1/job/foo/scale",
            res("get", "batch", "v1", "", "job", "foo", "scale"),
        ),
        row("TestGetNonAPIRequestInfo/bad root", "GET", "/not-api/version/resource", nr(NonResource::Other)),
        row(
            "TestGetNonAPIRequestInfo/group without enough steps",
            "GET",
            "/apis/extensions/v1beta1",
            nr(NonResource::GroupVersion("extensions", "v1beta1")),
        ),
        row(
            "TestGetNonAPIRequestInfo/group without enough steps 2",
            "GET",
            "/apis/extensions/v1beta1/",
            nr(NonResource::GroupVersion("extensions", "v1beta1")),
        ),
        row(
            "TestGetNonAPIRequestInfo/not enough steps",
            "GET",
            "/api/version",
            nr(NonResource::CoreVersion("version")),
        ),
        row("TestGetNonAPIRequestInfo/one step", "GET", "/api", nr(NonResource::ApiRoot)),
        row("TestGetNonAPIRequestInfo/zero step", "GET", "/", nr(NonResource::Other)),
        row("TestGetNonAPIRequestInfo/empty", "GET", "", nr(NonResource::Other)),
        // ---- TestSelectorParsing (name + verb; raw FieldSelector/LabelSelector copies are not modelled)
        row(
            "TestSelectorParsing/no selector",
            "GET",
            "/apis/group/version/resource",
            res("list", "group", "version", "", "resource", "", ""),
        ),
        row(
            "TestSelectorParsing/metadata.name selector",
            "GET",
            "/apis/group/version/resource?fieldSelector=metadata.name=name1",
            res("list", "group", "version", "", "resource", "name1", ""),
        ),
        row(
            "TestSelectorParsing/metadata.name selector with watch",
            "GET",
            "/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1",
            res("watch", "group", "version", "", "resource", "name1", ""),
        ),
        row(
            "TestSelectorParsing/random selector",
            "GET",
            "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux",
            res("list", "group", "version", "", "resource", "", ""),
        ),
        row(
            "TestSelectorParsing/invalid selector with metadata.name",
            "GET",
            "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo",
            res("list", "group", "version", "", "resource", "", ""),
        ),
        row(
            "TestSelectorParsing/invalid selector with metadata.name with watch",
            "GET",
            "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true",
            res("watch", "group", "version", "", "resource", "", ""),
        ),
        row(
            "TestSelectorParsing/invalid selector with metadata.name with watch false",
            "GET",
            "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false",
            res("list", "group", "version", "", "resource", "", ""),
        ),
        row(
            "TestSelectorParsing/selector on deletecollection is honored",
            "DELETE",
            "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux",
            res("deletecollection", "group", "version", "", "resource", "", ""),
        ),
        row(
            "TestSelectorParsing/selector on repeated param matches parsed param",
            "GET",
            "/apis/group/version/resource?fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar&labelSelector=foo=bar&labelSelector=foo=baz",
            res("list", "group", "version", "", "resource", "foo", ""),
        ),
        row(
            "TestSelectorParsing/selector on other verb is ignored",
            "GET",
            "/apis/group/version/resource/name?fieldSelector=foo=bar&labelSelector=foo=bar",
            res("get", "group", "version", "", "resource", "name", ""),
        ),
        row(
            "TestSelectorParsing/selector on deprecated root type watch is not parsed",
            "GET",
            "/apis/group/version/watch/resource?fieldSelector=metadata.name=foo&labelSelector=foo=bar",
            res("watch", "group", "version", "", "resource", "", ""),
        ),
        row(
            "TestSelectorParsing/selector on deprecated root item watch is not parsed",
            "GET",
            "/apis/group/version/watch/resource/name?fieldSelector=metadata.name=foo&labelSelector=foo=bar",
            res("watch", "group", "version", "", "resource", "name", ""),
        ),
    ];
    assert_eq!(rows.len(), 30 + 6 + 13 + 12, "every upstream case is present");
    run(&rows);
}

/// How `fieldSelector` sets `Name` (`NewRequestInfo` → `fields.ParseSelector` →
/// `RequiresExactMatch("metadata.name")` → `content.IsPathSegmentName`). Rows adapt apimachinery's
/// `pkg/fields/selector_test.go` cases (`TestSplitTerms`, `TestSplitTerm`, `TestSelectorParse`,
/// `TestDeterministicParse`, `TestRequiresExactMatch`) to a `metadata.name` term, so each row is what
/// kube-apiserver reports for `GET /api/v1/namespaces/ns1/pods?fieldSelector=<selector>`.
#[test]
fn upstream_field_selector_name() {
    struct F {
        name: &'static str,
        query: &'static str,
        want_name: &'static str,
    }
    let rows = [
        // TestSelectorParse testGoodStrings
        F {
            name: "TestSelectorParse/good x=a,y=b,z=c",
            query: "fieldSelector=x=a,metadata.name=b,z=c",
            want_name: "b",
        },
        F {
            name: "TestSelectorParse/good empty",
            query: "fieldSelector=",
            want_name: "",
        },
        F {
            name: "TestSelectorParse/good x!=a,y=b",
            query: "fieldSelector=x!=a,metadata.name=b",
            want_name: "b",
        },
        F {
            name: "TestSelectorParse/good x=a||y\\=b (escaped = in value)",
            query: r"fieldSelector=metadata.name=a||y\=b",
            want_name: "a||y=b",
        },
        F {
            name: "TestSelectorParse/good x=a\\=\\=b",
            query: r"fieldSelector=metadata.name=a\=\=b",
            want_name: "a==b",
        },
        // TestSelectorParse testBadStrings: the whole decode fails, so no name.
        F {
            name: "TestSelectorParse/bad x=a||y=b",
            query: "fieldSelector=metadata.name=a||y=b",
            want_name: "",
        },
        F {
            name: "TestSelectorParse/bad x==a==b",
            query: "fieldSelector=metadata.name==a==b",
            want_name: "",
        },
        F {
            name: "TestSelectorParse/bad x=a,b",
            query: "fieldSelector=metadata.name=a,b",
            want_name: "",
        },
        F {
            name: "TestSelectorParse/bad x in (a)",
            query: "fieldSelector=metadata.name%20in%20(a)",
            want_name: "",
        },
        F {
            name: "TestSelectorParse/bad x in (a,b,c)",
            query: "fieldSelector=metadata.name%20in%20(a,b,c)",
            want_name: "",
        },
        F {
            name: "TestSelectorParse/bad x",
            query: "fieldSelector=metadata.name",
            want_name: "",
        },
        // TestSplitTerms: empty terms are skipped, escaped commas do not split.
        F {
            name: "TestSplitTerms/trailing empty term a=a,",
            query: "fieldSelector=metadata.name=a,",
            want_name: "a",
        },
        F {
            name: "TestSplitTerms/leading empty term ,a=a",
            query: "fieldSelector=,metadata.name=a",
            want_name: "a",
        },
        F {
            name: "TestSplitTerms/escaped comma k=\\,,k2=v2",
            query: r"fieldSelector=metadata.name=a\,b,k2=v2",
            want_name: "a,b",
        },
        F {
            name: "TestSplitTerms/escaped backslash then comma k=\\\\,k2=v2",
            query: r"fieldSelector=metadata.name=a\\,k2=v2",
            want_name: r"a\",
        },
        F {
            name: "TestSplitTerms/non-escape sequences k=\\a\\b\\ (invalid escape)",
            query: r"fieldSelector=metadata.name=\a\b\",
            want_name: "",
        },
        F {
            name: "TestSplitTerms/orphan backslash k=\\",
            query: r"fieldSelector=metadata.name=a\",
            want_name: "",
        },
        F {
            name: "TestSplitTerms/multi-byte",
            query: "fieldSelector=함=수,metadata.name=록",
            want_name: "록",
        },
        // TestSplitTerm: first operator wins, `==` before `=`, no trimming of either side.
        F {
            name: "TestSplitTerm/b==value",
            query: "fieldSelector=metadata.name==value",
            want_name: "value",
        },
        F {
            name: "TestSplitTerm/c!=value",
            query: "fieldSelector=metadata.name!=value",
            want_name: "",
        },
        F {
            name: "TestSplitTerm/no trimming of the field",
            query: "fieldSelector=%20metadata.name=a",
            want_name: "",
        },
        F {
            name: "TestSplitTerm/no trimming of the value",
            query: "fieldSelector=metadata.name=%20a",
            want_name: " a",
        },
        // TestDeterministicParse: terms are sorted before RequiresExactMatch walks them.
        F {
            name: "TestDeterministicParse/sorted terms, first metadata.name in sort order",
            query: "fieldSelector=metadata.name=b,metadata.name=a",
            want_name: "a",
        },
        // TestRequiresExactMatch
        F {
            name: "TestRequiresExactMatch/valid hasTerm no value",
            query: "fieldSelector=metadata.name=",
            want_name: "",
        },
        F {
            name: "TestRequiresExactMatch/andTerm with non-match (empty term =)",
            query: "fieldSelector==,metadata.name=b",
            want_name: "b",
        },
        // content.IsPathSegmentName on the extracted value (requestinfo.go).
        F {
            name: "IsPathSegmentName/..",
            query: "fieldSelector=metadata.name=..",
            want_name: "",
        },
        F {
            name: "IsPathSegmentName/contains /",
            query: "fieldSelector=metadata.name=a%2Fb",
            want_name: "",
        },
    ];
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|f| {
            let path = format!("/api/v1/namespaces/ns1/pods?{}", f.query);
            let want = res("list", "", "v1", "ns1", "pods", f.want_name, "");
            let got = parse("GET", &path);
            (got != want).then(|| format!("{}: {path:?}\n   got {got:?}\n  want {want:?}", f.name))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} rows differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn percent_encoded_paths_are_classified_decoded() {
    use common::{non_resource, resource_request};
    use kube_peer_proxy::request::request_info::parse_decoded;
    let rows: Vec<(&str, &str, RequestKind<'static>)> = vec![
        // `job%73` is `jobs` to the apiserver: proxied upstream, so it must route like `jobs`.
        (
            "GET",
            "/apis/batch/v1/namespaces/default/job%73",
            resource_request("list", "batch", "v1", "default", "jobs", "", ""),
        ),
        (
            "GET",
            "/apis/b%61tch/v1/namespaces/default/jobs/j1",
            resource_request("get", "batch", "v1", "default", "jobs", "j1", ""),
        ),
        // `%2F` decodes to a separator: name `a`, subresource `b`.
        (
            "GET",
            "/api/v1/namespaces/default/pods/a%2Fb",
            resource_request("get", "", "v1", "default", "pods", "a", "b"),
        ),
        (
            "GET",
            "/api/v1/namespaces/default/pods/a%2fb",
            resource_request("get", "", "v1", "default", "pods", "a", "b"),
        ),
        // `%3F` is a `?` inside the path, not the start of the query.
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/x%3Fwatch=1",
            resource_request("get", "", "v1", "default", "configmaps", "x?watch=1", ""),
        ),
        // The raw query still counts (and is decoded on its own).
        (
            "GET",
            "/api/v1/namespaces/default/config%6Daps?watch=true",
            resource_request("watch", "", "v1", "default", "configmaps", "", ""),
        ),
        // `+` stays `+` in a path (Go's encodePath mode).
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/a+b",
            resource_request("get", "", "v1", "default", "configmaps", "a+b", ""),
        ),
        // Discovery paths decode too.
        (
            "GET",
            "/apis/b%61tch/v1",
            non_resource(NonResource::GroupVersion("batch", "v1")),
        ),
        // Invalid escapes: Go's server answers 400 before any handler; the local server says so.
        ("GET", "/api/v1/namespaces/default/pods/%zz", RequestKind::Invalid),
        ("GET", "/api/v1/namespaces/default/pods/%4", RequestKind::Invalid),
        ("GET", "/api/v1/namespaces/default/pods/%", RequestKind::Invalid),
        ("GET", "/api/v1/namespaces/default/pods/%+1", RequestKind::Invalid),
    ];
    for (method, path, want) in rows {
        let mut buf = String::new();
        assert_eq!(parse_decoded(method, path, &mut buf), want, "{path}");
    }
    // Without a `%` nothing is copied.
    let mut buf = String::new();
    let _ = parse_decoded("GET", "/api/v1/pods", &mut buf);
    assert!(buf.is_empty());
}
