//! Classifies a 404 from kube-apiserver for the local-first 404 guard: while a peer may serve a
//! resource type the local server does not, a 404 saying "this type is not served here" may be false
//! and must become a 503, but a 404 saying "this object does not exist" is genuine and must pass.
//! The two are told apart by the response body, exactly as kube-apiserver writes each kind.

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotFound {
    /// The path/type is not served by this server.
    TypeNotServed,
    /// A named object (or namespace) does not exist: `details.name` is set.
    ObjectMissing,
    /// Cannot tell (unparseable body, unknown content type).
    Unknown,
}

/// The magic prefix of kube-apiserver protobuf bodies
/// (`staging/src/k8s.io/apimachinery/pkg/runtime/serializer/protobuf/protobuf.go`, `protoEncodingPrefix`).
const PROTOBUF_MAGIC: &[u8] = b"k8s\x00";

enum Media {
    Text,
    Json,
    Protobuf,
    Other,
}

/// The media type without parameters, compared ASCII-case-insensitively.
fn media(content_type: &str) -> Media {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("text/plain") {
        Media::Text
    } else if essence.eq_ignore_ascii_case("application/json") {
        Media::Json
    } else if essence.eq_ignore_ascii_case("application/vnd.kubernetes.protobuf") {
        Media::Protobuf
    } else {
        Media::Other
    }
}

/// Whether the body must be read to classify (false for text/plain which is always TypeNotServed,
/// and for media types [`classify`] does not parse, which are always Unknown).
pub fn needs_body(content_type: &str) -> bool {
    matches!(media(content_type), Media::Json | Media::Protobuf)
}

/// Classifies a 404 response. `content_type` is the response Content-Type header value (may be
/// empty), `body` the full body. Meant for kube-apiserver's own handlers: `proxy` subresources and
/// aggregated API servers relay someone else's 404 body.
///
/// - `text/plain` → TypeNotServed: the end of the delegation chain (unknown group/version, or a
///   CRD resource/version/scope not served) is `http.NotFound`, `text/plain; charset=utf-8`,
///   `404 page not found\n` (`staging/src/k8s.io/apiserver/pkg/util/notfoundhandler/not_found_handler.go`;
///   the CRD handler delegates to it: `staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go`).
/// - a `Status` (JSON or protobuf) for a 404 with `details.name` empty → TypeNotServed: go-restful
///   finds the group/version's WebService but no route (unknown resource or subresource) and
///   `serviceErrorHandler` writes `NewGenericServerResponse(404, …)`: reason NotFound, message "the
///   server could not find the requested resource", `details: {}`
///   (`staging/src/k8s.io/apiserver/pkg/server/handler.go`, `staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go`).
/// - a `Status` for a 404 with `details.name` set → ObjectMissing: `NewNotFound(resource, name)`
///   from storage, and the namespace lifecycle admission's `namespaces "x" not found`
///   (`staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go`,
///   `staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go`). The CRD
///   handler also answers a subresource the CRD does not enable this way; that is the same on every
///   server (it comes from the CRD object), so it is no false 404 either.
/// - anything else (other media types such as YAML or CBOR, a body that is not a 404 `Status`,
///   malformed input) → Unknown.
pub fn classify(content_type: &str, body: &[u8]) -> NotFound {
    match media(content_type) {
        Media::Text => NotFound::TypeNotServed,
        Media::Json => parse_json(body).map_or(NotFound::Unknown, |s| decide(&s.view())),
        Media::Protobuf => parse_protobuf(body).map_or(NotFound::Unknown, |s| decide(&s)),
        Media::Other => NotFound::Unknown,
    }
}

/// The fields of a `metav1.Status` the decision reads (empty/0 when absent).
#[derive(Default)]
struct Status<'a> {
    kind: &'a [u8],
    code: i64,
    reason: &'a [u8],
    name: &'a [u8],
}

/// A 404 `Status` (code 404, or no code and reason NotFound) names an object or nothing.
/// `responsewriters.ErrorToAPIStatus` always sets kind `Status` and the code
/// (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/status.go`).
fn decide(s: &Status) -> NotFound {
    let is_404 = s.code == 404 || (s.code == 0 && s.reason == b"NotFound");
    if s.kind != b"Status" || !is_404 {
        NotFound::Unknown
    } else if s.name.is_empty() {
        NotFound::TypeNotServed
    } else {
        NotFound::ObjectMissing
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JsonStatus {
    kind: String,
    code: i64,
    reason: String,
    details: Option<JsonDetails>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct JsonDetails {
    name: String,
}

impl JsonStatus {
    fn view(&self) -> Status<'_> {
        Status {
            kind: self.kind.as_bytes(),
            code: self.code,
            reason: self.reason.as_bytes(),
            name: self.details.as_ref().map_or(&[][..], |d| d.name.as_bytes()),
        }
    }
}

fn parse_json(body: &[u8]) -> Option<JsonStatus> {
    serde_json::from_slice(body).ok()
}

/// Malformed protobuf.
struct Malformed;

/// The magic, then `runtime.Unknown` {1 typeMeta {2 kind}, 2 raw, 3 contentEncoding} whose `raw` is
/// `metav1.Status` {4 reason, 5 details {1 name}, 6 code}
/// (`staging/src/k8s.io/apimachinery/pkg/runtime/generated.proto`,
/// `staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`). Embedded messages that
/// occur twice merge, scalars that occur twice keep the last, as in protobuf.
fn parse_protobuf(body: &[u8]) -> Result<Status<'_>, Malformed> {
    let message = body.strip_prefix(PROTOBUF_MAGIC).ok_or(Malformed)?;
    let mut status = Status::default();
    let mut raw: &[u8] = &[];
    let mut content_encoding: &[u8] = &[];
    for field in Fields(message) {
        match field? {
            (1, type_meta) => {
                for field in Fields(type_meta.bytes()?) {
                    if let (2, kind) = field? {
                        status.kind = kind.bytes()?;
                    }
                }
            }
            (2, value) => raw = value.bytes()?,
            (3, value) => content_encoding = value.bytes()?,
            _ => {}
        }
    }
    // kube-apiserver leaves it empty; an encoded (e.g. gzip) `raw` cannot be read here.
    if !content_encoding.is_empty() {
        return Err(Malformed);
    }
    for field in Fields(raw) {
        match field? {
            (4, reason) => status.reason = reason.bytes()?,
            (5, details) => {
                for field in Fields(details.bytes()?) {
                    if let (1, name) = field? {
                        status.name = name.bytes()?;
                    }
                }
            }
            // int32: a negative code is a 10-byte varint above i64::MAX; any non-404 will do.
            (6, code) => status.code = i64::try_from(code.varint()?).unwrap_or(-1),
            _ => {}
        }
    }
    Ok(status)
}

/// A protobuf field value; fixed32/fixed64 values are skipped unread.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

impl<'a> Value<'a> {
    fn bytes(self) -> Result<&'a [u8], Malformed> {
        match self {
            Value::Bytes(b) => Ok(b),
            _ => Err(Malformed),
        }
    }

    fn varint(self) -> Result<u64, Malformed> {
        match self {
            Value::Varint(v) => Ok(v),
            _ => Err(Malformed),
        }
    }
}

/// Iterates over the `(field number, value)` pairs of a protobuf message; stops after the first
/// error. Groups (wire types 3 and 4), wire types 6 and 7 and field number 0 are malformed.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.0 = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u64, Value<'a>), Malformed> {
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 {
            return Err(Malformed);
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| Malformed)?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Value::Fixed
            }
            _ => return Err(Malformed),
        };
        Ok((number, value))
    }

    /// At most 10 bytes; bits past the 64th are dropped.
    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for (i, byte) in self.0.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.0 = self.0.get(i + 1..).ok_or(Malformed)?;
                return Ok(value);
            }
        }
        Err(Malformed)
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], Malformed> {
        let taken = self.0.get(..len).ok_or(Malformed)?;
        self.0 = self.0.get(len..).ok_or(Malformed)?;
        Ok(taken)
    }
}
