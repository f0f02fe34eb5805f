//! envoy/README.md's plugin field table against `src/config.rs`: every field the parser accepts has a
//! row, every row names a field the parser accepts, and each documented default is what the parser
//! really uses (the field set to the documented value parses to the same `Config` as the field left
//! out; a field documented as required is refused when missing).

// Helpers outside #[test] functions: a panic there is a test failure too.
#![allow(clippy::panic)]

use kube_peer_proxy::config::{Config, PeerGateConfig, FIELDS, IDENTITY_FIELDS, LEASE_FIELDS, PEER_GATE_FIELDS};
use serde_json::{json, Map, Value};

/// (field names of the row, default column) of every row of the "Plugin configuration" table.
fn doc_rows() -> Vec<(Vec<String>, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/envoy/README.md"))
        .unwrap_or_else(|e| panic!("envoy/README.md: {e}"));
    let section = readme
        .split("## Plugin configuration")
        .nth(1)
        .unwrap_or_else(|| panic!("envoy/README.md has no '## Plugin configuration' section"));
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(names), Some(default)) = (cols.get(1), cols.get(3)) else {
            panic!("odd row: {line}");
        };
        let names = names
            .split(',')
            .map(|n| n.trim().trim_matches('`').to_string())
            .collect();
        rows.push((names, default.to_string()));
    }
    rows
}

/// A valid configuration that sets every optional part, and where `field` lives in it.
fn base(field: &str) -> (Value, Option<&'static str>, String) {
    let full = json!({"local_cluster": "l",
                      "lease_discovery": {"cluster": "p", "local_hostname": "h", "peer_port": 6444},
                      "client_identity": {"username_headers": ["x-u"], "group_headers": ["x-g"]}});
    match field.split_once('.') {
        Some(("lease_discovery", f)) => (full, Some("lease_discovery"), f.to_string()),
        Some(("client_identity", f)) => (full, Some("client_identity"), f.to_string()),
        Some(_) => panic!("unknown part in {field}"),
        // Its documented default holds outside lease mode (in lease mode it is local_hostname).
        None if field == "local_name" => {
            let mut outside = full;
            part(&mut outside, None).remove("lease_discovery");
            (outside, None, field.to_string())
        }
        None => (full, None, field.to_string()),
    }
}

fn part<'a>(v: &'a mut Value, part: Option<&str>) -> &'a mut Map<String, Value> {
    let v = match part {
        Some(p) => &mut v[p],
        None => v,
    };
    v.as_object_mut().unwrap_or_else(|| panic!("not an object"))
}

fn parse(v: &Value) -> Result<Config, String> {
    Config::parse(v.to_string().as_bytes())
}

#[test]
fn every_accepted_field_is_documented_with_a_true_default() {
    let rows = doc_rows();
    let documented: Vec<&String> = rows.iter().flat_map(|(n, _)| n).collect();
    let accepted: Vec<String> = FIELDS
        .iter()
        .map(|f| f.to_string())
        .chain(LEASE_FIELDS.iter().map(|f| format!("lease_discovery.{f}")))
        .chain(IDENTITY_FIELDS.iter().map(|f| format!("client_identity.{f}")))
        .chain(PEER_GATE_FIELDS.iter().map(|f| f.to_string()))
        .collect();
    let missing: Vec<&String> = accepted.iter().filter(|f| !documented.contains(f)).collect();
    assert!(
        missing.is_empty(),
        "fields config.rs accepts but envoy/README.md does not list: {missing:?}"
    );
    let unknown: Vec<&&String> = documented.iter().filter(|f| !accepted.contains(f)).collect();
    assert!(
        unknown.is_empty(),
        "envoy/README.md lists fields config.rs does not accept: {unknown:?}"
    );

    let mut checked = 0;
    for (names, default) in &rows {
        for name in names {
            if PEER_GATE_FIELDS.contains(&name.as_str()) {
                // The peer gate's own configuration (one required field).
                assert!(default.contains("**required**"), "{name}: {default}");
                let err = PeerGateConfig::parse(b"{}").expect_err("allowed_names is required");
                assert!(err.contains(&format!("{name}: missing")), "{err}");
                assert!(PeerGateConfig::parse(format!("{{\"{name}\": []}}").as_bytes()).is_ok());
                checked += 1;
                continue;
            }
            let (good, p, f) = base(name);
            let without = {
                let mut v = good.clone();
                part(&mut v, p).remove(&f);
                v
            };
            if default.contains("**required**") {
                // "one is **required**" (local_hostname, local_address): missing both is refused.
                let mut v = without.clone();
                if default.starts_with("one is") {
                    for other in names {
                        part(&mut v, p).remove(base(other).2.as_str());
                    }
                }
                let err = parse(&v).expect_err(&format!("{name} is documented as required"));
                assert!(err.contains("missing"), "{name}: {err}");
            } else if default == "absent" {
                assert!(
                    parse(&without).is_ok(),
                    "{name}: the configuration without it is refused"
                );
                let with = parse(&good).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_ne!(
                    parse(&without).ok(),
                    Some(with.clone()),
                    "{name}: setting it changes nothing"
                );
            } else {
                // The default column holds the JSON value in backticks.
                let literal = default
                    .strip_prefix('`')
                    .and_then(|d| d.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("{name}: default {default:?} is not a `json value`"));
                let value: Value =
                    serde_json::from_str(literal).unwrap_or_else(|e| panic!("{name}: default {literal}: {e}"));
                let mut with = without.clone();
                part(&mut with, p).insert(f.clone(), value);
                assert_eq!(
                    parse(&with).map_err(|e| format!("{name} = {literal}: {e}")),
                    parse(&without),
                    "{name}: the documented default {literal} is not the parser's"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, accepted.len());
}
