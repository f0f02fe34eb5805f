//! Classifying kube-apiserver 404 bodies, as the server writes each kind. The JSON, YAML and text
//! bodies below are byte-for-byte what k8s.io/apiserver v0.36.3 (`NewAPIServerHandler` with go-restful
//! v3.13.0, `notfoundhandler.New`, `responsewriters.ErrorNegotiated`) wrote under `httptest`.
#![cfg(test)]

use kube_peer_proxy::request::not_found::{classify, needs_body, NotFound};

const JSON: &str = "application/json";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const TEXT: &str = "text/plain; charset=utf-8";

/// `http.NotFound` (the end of the delegation chain: unknown group/version, CRD not served).
const TEXT_404: &[u8] = b"404 page not found\n";

/// go-restful found the group/version's WebService but no route: `serviceErrorHandler` writes
/// `NewGenericServerResponse(404, "", GroupResource{}, "", "404: Page Not Found", 0, false)`
/// through the JSON serializer (`json.Encoder`, hence the newline).
const JSON_TYPE_NOT_SERVED: &[u8] = b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\
\"message\":\"the server could not find the requested resource\",\"reason\":\"NotFound\",\"details\":{},\"code\":404}\n";

/// The same Status when output negotiation failed (`WriteRawJSON`: `json.MarshalIndent`, no newline).
const JSON_TYPE_NOT_SERVED_INDENTED: &[u8] = br#"{
  "kind": "Status",
  "apiVersion": "v1",
  "metadata": {},
  "status": "Failure",
  "message": "the server could not find the requested resource",
  "reason": "NotFound",
  "details": {},
  "code": 404
}"#;

/// `NewNotFound(schema.GroupResource{Resource: "pods"}, "nginx")` from the registry.
const JSON_POD_MISSING: &[u8] = b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\
\"message\":\"pods \\\"nginx\\\" not found\",\"reason\":\"NotFound\",\"details\":{\"name\":\"nginx\",\"kind\":\"pods\"},\"code\":404}\n";

/// `NewNotFound(schema.GroupResource{Group: "apps", Resource: "deployments"}, "web")`.
const JSON_DEPLOYMENT_MISSING: &[u8] =
    b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\
\"message\":\"deployments.apps \\\"web\\\" not found\",\"reason\":\"NotFound\",\
\"details\":{\"name\":\"web\",\"group\":\"apps\",\"kind\":\"deployments\"},\"code\":404}\n";

/// Create in a namespace that does not exist (namespace lifecycle admission).
const JSON_NAMESPACE_MISSING: &[u8] =
    b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\
\"message\":\"namespaces \\\"nosuchns\\\" not found\",\"reason\":\"NotFound\",\
\"details\":{\"name\":\"nosuchns\",\"kind\":\"namespaces\"},\"code\":404}\n";

/// A CRD subresource that is not enabled: the CRD handler writes `NewNotFound(group/resource, name)`.
const JSON_CRD_SUBRESOURCE: &[u8] =
    b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\
\"message\":\"crontabs.stable.example.com \\\"my-cron\\\" not found\",\"reason\":\"NotFound\",\
\"details\":{\"name\":\"my-cron\",\"group\":\"stable.example.com\",\"kind\":\"crontabs\"},\"code\":404}\n";

/// `routes.IndexLister` with status 404 (a generic server with no delegate): JSON, not a Status.
const JSON_INDEX: &[u8] = b"{\n  \"paths\": [\n    \"/apis\",\n    \"/healthz\"\n  ]\n}";

// A minimal protobuf encoder, writing fields as gogo-protobuf does for these messages: every
// optional string is written even when empty, and embedded messages are always present.

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

fn key(number: u64, wire_type: u64) -> Vec<u8> {
    varint(number << 3 | wire_type)
}

fn bytes_field(number: u64, value: &[u8]) -> Vec<u8> {
    [key(number, 2), varint(value.len() as u64), value.to_vec()].concat()
}

fn varint_field(number: u64, value: u64) -> Vec<u8> {
    [key(number, 0), varint(value)].concat()
}

/// `metav1.Status` as `Status.MarshalToSizedBuffer` writes it; `details` always present, as
/// `NewGenericServerResponse` and `NewNotFound` both set it.
fn status_proto(message: &str, reason: &str, name: &str, group: &str, kind: &str, code: u64) -> Vec<u8> {
    let list_meta = [bytes_field(1, b""), bytes_field(2, b""), bytes_field(3, b"")].concat();
    let details = [
        bytes_field(1, name.as_bytes()),
        bytes_field(2, group.as_bytes()),
        bytes_field(3, kind.as_bytes()),
        varint_field(5, 0),
        bytes_field(6, b""),
    ]
    .concat();
    [
        bytes_field(1, &list_meta),
        bytes_field(2, b"Failure"),
        bytes_field(3, message.as_bytes()),
        bytes_field(4, reason.as_bytes()),
        bytes_field(5, &details),
        varint_field(6, code),
    ]
    .concat()
}

/// The protobuf serializer's body: magic, then `runtime.Unknown` {typeMeta, raw, contentEncoding,
/// contentType}.
fn envelope(kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = [bytes_field(1, b"v1"), bytes_field(2, kind.as_bytes())].concat();
    [
        b"k8s\x00".to_vec(),
        bytes_field(1, &type_meta),
        bytes_field(2, raw),
        bytes_field(3, b""),
        bytes_field(4, b""),
    ]
    .concat()
}

/// {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
///  "message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}
fn pb_type_not_served() -> Vec<u8> {
    envelope(
        "Status",
        &status_proto(
            "the server could not find the requested resource",
            "NotFound",
            "",
            "",
            "",
            404,
        ),
    )
}

/// {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \"web\" not found",
///  "reason":"NotFound","details":{"name":"web","group":"apps","kind":"deployments"},"code":404}
fn pb_deployment_missing() -> Vec<u8> {
    envelope(
        "Status",
        &status_proto(
            "deployments.apps \"web\" not found",
            "NotFound",
            "web",
            "apps",
            "deployments",
            404,
        ),
    )
}

/// The bodies `genericapiserver.NewAPIServerHandler` (go-restful v3.13.0) and `responsewriters.ErrorNegotiated`
/// of k8s.io/apiserver v0.36.3 wrote for `Accept: application/vnd.kubernetes.protobuf` (captured once
/// with `httptest`): the go-restful 404, then `NewNotFound(apps/deployments, "web")`.
const CAPTURED_PB_TYPE_NOT_SERVED: &[u8] = b"k8s\x00\n\x0c\n\x02v1\x12\x06Status\x12\\\n\x06\n\x00\x12\x00\x1a\x00\x12\x07Failure\
\x1a0the server could not find the requested resource\"\x08NotFound*\n\n\x00\x12\x00\x1a\x00(\x002\x000\x94\x03\x1a\x00\"\x00";
const CAPTURED_PB_DEPLOYMENT_MISSING: &[u8] = b"k8s\x00\n\x0c\n\x02v1\x12\x06Status\x12^\n\x06\n\x00\x12\x00\x1a\x00\x12\x07Failure\
\x1a deployments.apps \"web\" not found\"\x08NotFound*\x1c\n\x03web\x12\x04apps\x1a\x0bdeployments(\x002\x000\x94\x03\x1a\x00\"\x00";

/// The go-restful 404 for `Accept: application/yaml` (captured the same way).
const CAPTURED_YAML_TYPE_NOT_SERVED: &[u8] = b"apiVersion: v1\ncode: 404\ndetails: {}\nkind: Status\n\
message: the server could not find the requested resource\nmetadata: {}\nreason: NotFound\nstatus: Failure\n";

#[test]
fn protobuf_helper_matches_the_wire_format() {
    assert_eq!(pb_type_not_served(), CAPTURED_PB_TYPE_NOT_SERVED);
    assert_eq!(pb_deployment_missing(), CAPTURED_PB_DEPLOYMENT_MISSING);
}

#[test]
fn classify_table() {
    struct Row {
        desc: &'static str,
        content_type: &'static str,
        body: Vec<u8>,
        want: NotFound,
    }
    let row = |desc, content_type, body: &[u8], want| Row {
        desc,
        content_type,
        body: body.to_vec(),
        want,
    };
    let type_not_served = pb_type_not_served();
    let deployment_missing = pb_deployment_missing();
    // Ends inside the 404 varint (0x94 0x03), so `raw` is also cut short.
    let truncated = &type_not_served[..type_not_served.len() - 6];
    let rows = [
        // text/plain: http.NotFound, whatever the body.
        row("http.NotFound", TEXT, TEXT_404, NotFound::TypeNotServed),
        row("text/plain without charset", "text/plain", TEXT_404, NotFound::TypeNotServed),
        row("text/plain, empty body", TEXT, b"", NotFound::TypeNotServed),
        row("TEXT/PLAIN upper case", "TEXT/Plain; Charset=UTF-8", TEXT_404, NotFound::TypeNotServed),
        // JSON
        row("go-restful 404", JSON, JSON_TYPE_NOT_SERVED, NotFound::TypeNotServed),
        row("go-restful 404, indented", JSON, JSON_TYPE_NOT_SERVED_INDENTED, NotFound::TypeNotServed),
        row("pod missing", JSON, JSON_POD_MISSING, NotFound::ObjectMissing),
        row("deployment missing", JSON, JSON_DEPLOYMENT_MISSING, NotFound::ObjectMissing),
        row("namespace missing", JSON, JSON_NAMESPACE_MISSING, NotFound::ObjectMissing),
        row("CRD subresource not enabled", JSON, JSON_CRD_SUBRESOURCE, NotFound::ObjectMissing),
        row("charset parameter", "application/json; charset=utf-8", JSON_POD_MISSING, NotFound::ObjectMissing),
        row("upper-case media type", "Application/JSON", JSON_TYPE_NOT_SERVED, NotFound::TypeNotServed),
        row("spaces around", " application/json ;charset=utf-8", JSON_POD_MISSING, NotFound::ObjectMissing),
        row(
            "details.name empty string",
            JSON,
            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","details":{"name":"","kind":"pods"},"code":404}"#,
            NotFound::TypeNotServed,
        ),
        row(
            "no details at all",
            JSON,
            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#,
            NotFound::TypeNotServed,
        ),
        row(
            "reason NotFound without code",
            JSON,
            br#"{"kind":"Status","reason":"NotFound","details":{"name":"x"}}"#,
            NotFound::ObjectMissing,
        ),
        row(
            "a 503 Status",
            JSON,
            br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the request has been made before all known HTTP paths have been installed, please try again","reason":"ServiceUnavailable","details":{"retryAfterSeconds":5},"code":503}"#,
            NotFound::Unknown,
        ),
        row(
            "code 500 with reason NotFound",
            JSON,
            br#"{"kind":"Status","reason":"NotFound","code":500}"#,
            NotFound::Unknown,
        ),
        row(
            "not kind Status",
            JSON,
            br#"{"kind":"Pod","reason":"NotFound","code":404}"#,
            NotFound::Unknown,
        ),
        row("JSON that is not a Status (IndexLister)", JSON, JSON_INDEX, NotFound::Unknown),
        row("JSON array", JSON, b"[]", NotFound::Unknown),
        row("JSON string", JSON, b"\"404 page not found\"", NotFound::Unknown),
        row("code of the wrong type", JSON, br#"{"kind":"Status","code":"404"}"#, NotFound::Unknown),
        row("truncated JSON", JSON, &JSON_POD_MISSING[..40], NotFound::Unknown),
        row("empty JSON body", JSON, b"", NotFound::Unknown),
        row("text body as JSON", JSON, TEXT_404, NotFound::Unknown),
        // protobuf
        row("protobuf go-restful 404", PROTOBUF, &type_not_served, NotFound::TypeNotServed),
        row("protobuf object missing", PROTOBUF, &deployment_missing, NotFound::ObjectMissing),
        row("protobuf upper case", "APPLICATION/VND.KUBERNETES.PROTOBUF", &type_not_served, NotFound::TypeNotServed),
        row("protobuf with parameters", "application/vnd.kubernetes.protobuf; charset=utf-8", &deployment_missing, NotFound::ObjectMissing),
        row("protobuf empty body", PROTOBUF, b"", NotFound::Unknown),
        row("protobuf magic only", PROTOBUF, b"k8s\x00", NotFound::Unknown),
        row("protobuf wrong magic", PROTOBUF, &[b"k8s\x01", &type_not_served[4..]].concat(), NotFound::Unknown),
        row("protobuf without magic", PROTOBUF, &type_not_served[4..], NotFound::Unknown),
        row("protobuf truncated", PROTOBUF, truncated, NotFound::Unknown),
        row("protobuf truncated in a string", PROTOBUF, &deployment_missing[..30], NotFound::Unknown),
        row("JSON body as protobuf", PROTOBUF, JSON_POD_MISSING, NotFound::Unknown),
        row("garbage", PROTOBUF, b"k8s\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", NotFound::Unknown),
        // other media types
        row("YAML", "application/yaml", CAPTURED_YAML_TYPE_NOT_SERVED, NotFound::Unknown),
        row("CBOR", "application/cbor", b"\xd9\xd9\xf7", NotFound::Unknown),
        row("empty content type", "", JSON_TYPE_NOT_SERVED, NotFound::Unknown),
        row("text/html", "text/html", TEXT_404, NotFound::Unknown),
    ];
    for r in &rows {
        assert_eq!(classify(r.content_type, &r.body), r.want, "{}", r.desc);
    }
}

#[test]
fn protobuf_edge_cases() {
    let status = |fields: &[Vec<u8>]| envelope("Status", &fields.concat());
    let details = |name: &str| bytes_field(5, &bytes_field(1, name.as_bytes()));
    struct Row {
        desc: &'static str,
        body: Vec<u8>,
        want: NotFound,
    }
    let rows = [
        Row {
            desc: "minimal: code only",
            body: status(&[varint_field(6, 404)]),
            want: NotFound::TypeNotServed,
        },
        Row {
            desc: "details.name empty string",
            body: status(&[details(""), varint_field(6, 404)]),
            want: NotFound::TypeNotServed,
        },
        Row {
            desc: "details twice merge: the name of the first stays",
            body: status(&[
                details("x"),
                bytes_field(5, &bytes_field(3, b"pods")),
                varint_field(6, 404),
            ]),
            want: NotFound::ObjectMissing,
        },
        Row {
            desc: "reason NotFound without code",
            body: status(&[bytes_field(4, b"NotFound"), details("x")]),
            want: NotFound::ObjectMissing,
        },
        Row {
            desc: "code twice: the last wins",
            body: status(&[varint_field(6, 404), varint_field(6, 503)]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "negative code (10-byte varint)",
            body: status(&[varint_field(6, u64::MAX)]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "unknown fields of every wire type are skipped",
            body: status(&[
                [key(9, 1), vec![0; 8]].concat(),
                [key(10, 5), vec![0; 4]].concat(),
                varint_field(11, 7),
                bytes_field(12, b"x"),
                varint_field(6, 404),
            ]),
            want: NotFound::TypeNotServed,
        },
        Row {
            desc: "truncated fixed64",
            body: status(&[varint_field(6, 404), [key(9, 1), vec![0; 7]].concat()]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "group wire type",
            body: status(&[varint_field(6, 404), key(9, 3), key(9, 4)]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "field number 0",
            body: status(&[varint_field(6, 404), varint_field(0, 1)]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "wire type 7",
            body: status(&[varint_field(6, 404), key(1, 7)]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "code with the wrong wire type",
            body: status(&[bytes_field(6, b"404")]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "details with the wrong wire type",
            body: status(&[varint_field(5, 1), varint_field(6, 404)]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "length past the end",
            body: status(&[
                varint_field(6, 404),
                [key(3, 2), varint(1000), b"short".to_vec()].concat(),
            ]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "huge length",
            body: status(&[varint_field(6, 404), [key(3, 2), varint(u64::MAX)].concat()]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "raw ends inside a varint",
            body: status(&[[key(6, 0), vec![0x94]].concat()]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "varint longer than 10 bytes",
            body: status(&[[key(6, 0), vec![0x80; 10], vec![0x01]].concat()]),
            want: NotFound::Unknown,
        },
        Row {
            desc: "not kind Status",
            body: envelope("Pod", &status_proto("", "NotFound", "", "", "", 404)),
            want: NotFound::Unknown,
        },
        Row {
            desc: "no raw",
            body: [b"k8s\x00".to_vec(), bytes_field(1, &bytes_field(2, b"Status"))].concat(),
            want: NotFound::Unknown,
        },
        Row {
            desc: "gzip content encoding",
            body: [pb_type_not_served(), bytes_field(3, b"gzip")].concat(),
            want: NotFound::Unknown,
        },
    ];
    for r in &rows {
        assert_eq!(classify(PROTOBUF, &r.body), r.want, "{}", r.desc);
    }
}

#[test]
fn needs_body_only_for_parsed_media_types() {
    let rows = [
        (TEXT, false),
        ("text/plain", false),
        (JSON, true),
        ("application/json; charset=utf-8", true),
        ("APPLICATION/JSON", true),
        (PROTOBUF, true),
        ("application/yaml", false),
        ("application/cbor", false),
        ("", false),
    ];
    for (content_type, want) in rows {
        assert_eq!(needs_body(content_type), want, "{content_type:?}");
        if !want {
            // Without the body, the answer is the same as with any body.
            assert_eq!(
                classify(content_type, b""),
                classify(content_type, JSON_POD_MISSING),
                "{content_type:?}"
            );
        }
    }
}
