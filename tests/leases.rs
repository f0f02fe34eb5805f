//! Identity leases → peer membership: lease validity, own-lease exclusion, addresses, expiry, diff.
#![cfg(test)]

use kube_peer_proxy::discovery::leases::{
    diff, parse_address, parse_lease_list, parse_lease_list_at, parse_lease_members, parse_rfc3339_ms, peer_address,
    Changes, LeasePeer, Members, Own, ADDRESS_ANNOTATION, HOSTNAME_LABEL, IDENTITY_LABEL, LEASE_LIST_PATH,
};

/// 2026-07-23T10:00:00Z in ms since the epoch.
const T0: u64 = 1_784_800_800_000;
const HOUR_MS: u64 = 3_600_000;

/// A LeaseList as `kubectl get --raw` shows it for three apiservers (`a` is ours), with a
/// kube-scheduler leader-election lease that has no identity label mixed in (an unfiltered list).
const LIST: &str = r#"{
  "kind": "LeaseList",
  "apiVersion": "coordination.k8s.io/v1",
  "metadata": {"resourceVersion": "4711"},
  "items": [
    {
      "metadata": {
        "name": "apiserver-xf4uclsx2fmrs6b2ifvmrrjqsq",
        "namespace": "kube-system",
        "uid": "0b5f7f3e-6c1a-4a63-9d0c-3f9a3c1f2a11",
        "resourceVersion": "4700",
        "creationTimestamp": "2026-07-23T09:00:00Z",
        "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": "cp-a"},
        "annotations": {"kubernetes.io/peer-advertise-address": "10.0.0.1:6443"},
        "managedFields": [{"manager": "kube-apiserver", "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
                           "time": "2026-07-23T09:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {}}]
      },
      "spec": {
        "holderIdentity": "apiserver-xf4uclsx2fmrs6b2ifvmrrjqsq_6f1c2d3e-0000-4000-8000-000000000001",
        "leaseDurationSeconds": 3600,
        "acquireTime": "2026-07-23T09:00:00.000000Z",
        "renewTime": "2026-07-23T10:00:00.000000Z"
      }
    },
    {
      "metadata": {
        "name": "apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa",
        "namespace": "kube-system",
        "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": "cp-b"},
        "annotations": {"kubernetes.io/peer-advertise-address": "10.0.0.2:6443"}
      },
      "spec": {
        "holderIdentity": "apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa_6f1c2d3e-0000-4000-8000-000000000002",
        "leaseDurationSeconds": 3600,
        "renewTime": "2026-07-23T10:00:00.000000Z"
      }
    },
    {
      "metadata": {
        "name": "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb",
        "namespace": "kube-system",
        "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": "cp-c"}
      },
      "spec": {
        "holderIdentity": "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb_6f1c2d3e-0000-4000-8000-000000000003",
        "leaseDurationSeconds": 3600,
        "renewTime": "2026-07-23T12:00:00.500000+02:00"
      }
    },
    {
      "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
      "spec": {
        "holderIdentity": "cp-a_5a4b3c2d-0000-4000-8000-000000000009",
        "leaseDurationSeconds": 15,
        "renewTime": "2026-07-23T10:00:00.000000Z",
        "leaseTransitions": 2
      }
    }
  ]
}"#;

fn own_a() -> Own {
    Own {
        hostname: Some("cp-a".into()),
        address: None,
    }
}

fn hosts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(h, a)| (h.to_string(), a.to_string())).collect()
}

fn peer(id: &str, holder: &str) -> LeasePeer {
    LeasePeer {
        id: id.into(),
        holder: holder.into(),
        hostname: String::new(),
        address: None,
        expires_ms: None,
    }
}

fn ids(peers: &[LeasePeer]) -> Vec<&str> {
    peers.iter().map(|p| p.id.as_str()).collect()
}

/// A one-item LeaseList with the given metadata and spec objects.
fn one(metadata: &str, spec: &str) -> String {
    format!(
        r#"{{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{{}},"items":[{{"metadata":{metadata},"spec":{spec}}}]}}"#
    )
}

fn identity_meta(name: &str, hostname: &str, annotations: &str) -> String {
    format!(
        r#"{{"name":"{name}","labels":{{"{IDENTITY_LABEL}":"kube-apiserver","{HOSTNAME_LABEL}":"{hostname}"}},"annotations":{annotations}}}"#
    )
}

#[test]
fn constants_match_upstream() {
    assert_eq!(IDENTITY_LABEL, "apiserver.kubernetes.io/identity");
    assert_eq!(HOSTNAME_LABEL, "kubernetes.io/hostname");
    assert_eq!(ADDRESS_ANNOTATION, "kubernetes.io/peer-advertise-address");
    assert_eq!(
        LEASE_LIST_PATH,
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver"
    );
}

#[test]
fn realistic_list_keeps_identity_peers_but_not_own_or_other_leases() {
    let peers = parse_lease_list(LIST.as_bytes(), &own_a(), &hosts(&[("cp-c", "10.0.0.3:6443")])).unwrap();
    assert_eq!(
        peers,
        vec![
            LeasePeer {
                id: "apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa".into(),
                holder: "apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa_6f1c2d3e-0000-4000-8000-000000000002".into(),
                hostname: "cp-b".into(),
                address: Some("10.0.0.2:6443".into()),
                expires_ms: Some(T0 + HOUR_MS),
            },
            LeasePeer {
                id: "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb".into(),
                holder: "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb_6f1c2d3e-0000-4000-8000-000000000003".into(),
                hostname: "cp-c".into(),
                address: Some("10.0.0.3:6443".into()),
                expires_ms: Some(T0 + 500 + HOUR_MS),
            },
        ]
    );
}

#[test]
fn own_lease_is_matched_by_address_too() {
    let own = Own {
        hostname: None,
        address: Some("10.0.0.2:6443".into()),
    };
    let peers = parse_lease_list(LIST.as_bytes(), &own, &[]).unwrap();
    assert_eq!(
        ids(&peers),
        [
            "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb",
            "apiserver-xf4uclsx2fmrs6b2ifvmrrjqsq"
        ]
    );
    // Compared in canonical form.
    let own = Own {
        hostname: None,
        address: Some("[2001:DB8::0:1]:443".into()),
    };
    let body = one(
        &identity_meta(
            "apiserver-x",
            "h",
            r#"{"kubernetes.io/peer-advertise-address":"[2001:db8::1]:443"}"#,
        ),
        r#"{"holderIdentity":"x_1"}"#,
    );
    assert!(parse_lease_list(body.as_bytes(), &own, &[]).unwrap().is_empty());
    // An own address matches neither an address-less lease nor another address.
    let own = Own {
        hostname: None,
        address: Some("10.9.9.9:6443".into()),
    };
    assert_eq!(parse_lease_list(LIST.as_bytes(), &own, &[]).unwrap().len(), 3);
}

#[test]
fn without_own_identification_every_identity_lease_is_a_peer() {
    let peers = parse_lease_list(LIST.as_bytes(), &Own::default(), &[]).unwrap();
    assert_eq!(peers.len(), 3);
    // An empty own hostname matches no lease (not even one without the hostname label).
    let own = Own {
        hostname: Some(String::new()),
        address: None,
    };
    let body = one(
        r#"{"name":"apiserver-x","labels":{"apiserver.kubernetes.io/identity":"kube-apiserver"}}"#,
        r#"{"holderIdentity":"x_1"}"#,
    );
    let peers = parse_lease_list(body.as_bytes(), &own, &[]).unwrap();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].hostname, "");
}

#[test]
fn annotation_wins_over_hosts_and_hosts_fill_in() {
    let h = hosts(&[("cp-b", "192.168.0.2:443"), ("cp-c", "192.168.0.3:443")]);
    let peers = parse_lease_list(LIST.as_bytes(), &own_a(), &h).unwrap();
    assert_eq!(peers[0].address.as_deref(), Some("10.0.0.2:6443"));
    assert_eq!(peers[1].address.as_deref(), Some("192.168.0.3:443"));
    // No annotation and no hosts entry: still a member, address unknown.
    let peers = parse_lease_list(LIST.as_bytes(), &own_a(), &[]).unwrap();
    assert_eq!(peers[1].id, "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb");
    assert_eq!(peers[1].address, None);
}

#[test]
fn invalid_addresses_fall_back_to_hosts_or_none() {
    let meta = identity_meta(
        "apiserver-x",
        "cp-x",
        r#"{"kubernetes.io/peer-advertise-address":"cp-x.example:6443"}"#,
    );
    let body = one(&meta, r#"{"holderIdentity":"x_1"}"#);
    let peers = parse_lease_list(body.as_bytes(), &Own::default(), &[]).unwrap();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].address, None);
    let peers = parse_lease_list(body.as_bytes(), &Own::default(), &hosts(&[("cp-x", "10.1.1.1:6443")])).unwrap();
    assert_eq!(peers[0].address.as_deref(), Some("10.1.1.1:6443"));
    // A hosts entry must be an IP literal too.
    let peers = parse_lease_list(body.as_bytes(), &Own::default(), &hosts(&[("cp-x", "cp-x:6443")])).unwrap();
    assert_eq!(peers[0].address, None);
}

#[test]
fn ipv6_annotation_is_canonicalized() {
    let meta = identity_meta(
        "apiserver-x",
        "cp-x",
        r#"{"kubernetes.io/peer-advertise-address":"[FD00:0:0:0::0A]:6443"}"#,
    );
    let body = one(&meta, r#"{"holderIdentity":"x_1"}"#);
    let peers = parse_lease_list(body.as_bytes(), &Own::default(), &[]).unwrap();
    assert_eq!(peers[0].address.as_deref(), Some("[fd00::a]:6443"));
}

#[test]
fn peer_port_replaces_the_advertised_port_only() {
    assert_eq!(
        peer_address("10.0.0.2:6443", Some(6444)).as_deref(),
        Some("10.0.0.2:6444")
    );
    assert_eq!(peer_address("10.0.0.2:6443", None).as_deref(), Some("10.0.0.2:6443"));
    assert_eq!(
        peer_address("[FD00::0B]:6443", Some(6444)).as_deref(),
        Some("[fd00::b]:6444")
    );
    // The advertised address must still be a usable address: the port does not rescue it.
    for bad in [
        "cp-b:6443",
        "10.0.0.2",
        "10.0.0.2:0",
        "0.0.0.0:6443",
        "10.0.0.2:http",
        "",
    ] {
        assert_eq!(peer_address(bad, Some(6444)), None, "{bad:?}");
    }

    // The list from kube-apiservers that advertise --advertise-address:--secure-port (kubeadm's
    // layout: Envoy's client listener), peers reached at their peer listener instead.
    let h = hosts(&[("cp-c", "10.0.0.3:7000")]);
    let peers = parse_lease_list_at(LIST.as_bytes(), &own_a(), &h, Some(6444)).unwrap();
    assert_eq!(
        ids(&peers),
        [
            "apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa",
            "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb"
        ]
    );
    assert_eq!(peers[0].address.as_deref(), Some("10.0.0.2:6444"));
    // A hosts entry (a server without the annotation) is used as written.
    assert_eq!(peers[1].address.as_deref(), Some("10.0.0.3:7000"));
    // Without peer_port: the advertised port, as before.
    let peers = parse_lease_list_at(LIST.as_bytes(), &own_a(), &h, None).unwrap();
    assert_eq!(peers[0].address.as_deref(), Some("10.0.0.2:6443"));
    assert_eq!(parse_lease_list(LIST.as_bytes(), &own_a(), &h).unwrap(), peers);
}

#[test]
fn own_address_matches_the_advertised_or_the_resolved_address() {
    for own_address in ["10.0.0.1:6443", "10.0.0.1:6444"] {
        let own = Own {
            hostname: None,
            address: Some(own_address.into()),
        };
        let peers = parse_lease_list_at(LIST.as_bytes(), &own, &[], Some(6444)).unwrap();
        assert_eq!(
            ids(&peers),
            [
                "apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa",
                "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb"
            ],
            "{own_address}"
        );
    }
    // Another port of the same host is not this server.
    let own = Own {
        hostname: None,
        address: Some("10.0.0.1:7000".into()),
    };
    assert_eq!(
        parse_lease_list_at(LIST.as_bytes(), &own, &[], Some(6444))
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn holder_identity_must_be_present_and_non_empty() {
    let meta = identity_meta("apiserver-x", "cp-x", "{}");
    for spec in [r#"{}"#, r#"{"holderIdentity":null}"#, r#"{"holderIdentity":""}"#] {
        let body = one(&meta, spec);
        assert_eq!(
            parse_lease_list(body.as_bytes(), &Own::default(), &[]).unwrap(),
            vec![],
            "{spec}"
        );
    }
    // No spec at all, or a null one.
    let body = r#"{"kind":"LeaseList","items":[{"metadata":{"name":"apiserver-x","labels":{"apiserver.kubernetes.io/identity":"kube-apiserver"}}},
        {"metadata":{"name":"apiserver-y","labels":{"apiserver.kubernetes.io/identity":"kube-apiserver"}},"spec":null}]}"#;
    assert!(parse_lease_list(body.as_bytes(), &Own::default(), &[])
        .unwrap()
        .is_empty());
}

#[test]
fn identity_label_value_must_be_kube_apiserver() {
    for labels in [
        r#"{"apiserver.kubernetes.io/identity":"sample-apiserver"}"#,
        r#"{"apiserver.kubernetes.io/identity":""}"#,
        r#"{"k8s.io/component":"kube-apiserver"}"#,
        "{}",
        "null",
    ] {
        let body = one(
            &format!(r#"{{"name":"apiserver-x","labels":{labels}}}"#),
            r#"{"holderIdentity":"x_1"}"#,
        );
        assert!(
            parse_lease_list(body.as_bytes(), &Own::default(), &[])
                .unwrap()
                .is_empty(),
            "{labels}"
        );
    }
}

#[test]
fn nameless_and_duplicate_leases() {
    let body = one(
        r#"{"labels":{"apiserver.kubernetes.io/identity":"kube-apiserver"}}"#,
        r#"{"holderIdentity":"x_1"}"#,
    );
    assert!(parse_lease_list(body.as_bytes(), &Own::default(), &[])
        .unwrap()
        .is_empty());
    let item = |holder: &str| {
        format!(
            r#"{{"metadata":{{"name":"apiserver-x","labels":{{"apiserver.kubernetes.io/identity":"kube-apiserver"}}}},"spec":{{"holderIdentity":"{holder}"}}}}"#
        )
    };
    let body = format!(r#"{{"kind":"LeaseList","items":[{},{}]}}"#, item("x_1"), item("x_2"));
    let peers = parse_lease_list(body.as_bytes(), &Own::default(), &[]).unwrap();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].holder, "x_1");
}

#[test]
fn missing_renew_time_or_duration_means_no_expiry() {
    let meta = identity_meta("apiserver-x", "cp-x", "null");
    for spec in [
        r#"{"holderIdentity":"x_1","leaseDurationSeconds":3600}"#,
        r#"{"holderIdentity":"x_1","leaseDurationSeconds":3600,"renewTime":null}"#,
        r#"{"holderIdentity":"x_1","renewTime":"2026-07-23T10:00:00.000000Z"}"#,
        r#"{"holderIdentity":"x_1","leaseDurationSeconds":null,"renewTime":"2026-07-23T10:00:00.000000Z"}"#,
        r#"{"holderIdentity":"x_1","leaseDurationSeconds":3600,"renewTime":"yesterday"}"#,
    ] {
        let peers = parse_lease_list(one(&meta, spec).as_bytes(), &Own::default(), &[]).unwrap();
        assert_eq!(peers.len(), 1, "{spec}");
        assert_eq!(peers[0].expires_ms, None, "{spec}");
        assert!(peers[0].is_live(u64::MAX), "{spec}");
    }
}

#[test]
fn expiry_is_renew_time_plus_duration_and_live_through_the_edge() {
    let peers = parse_lease_list(LIST.as_bytes(), &own_a(), &[]).unwrap();
    let b = &peers[0];
    assert_eq!(b.expires_ms, Some(T0 + HOUR_MS));
    assert!(b.is_live(T0));
    assert!(b.is_live(T0 + HOUR_MS - 1));
    assert!(
        b.is_live(T0 + HOUR_MS),
        "exactly at expiry is not yet expired (Go: expiry.Before(now))"
    );
    assert!(!b.is_live(T0 + HOUR_MS + 1));
    // A non-positive duration (forbidden by validation) expires at or before renewTime, like Go's Add.
    let meta = identity_meta("apiserver-x", "cp-x", "{}");
    let spec = r#"{"holderIdentity":"x_1","leaseDurationSeconds":-10,"renewTime":"2026-07-23T10:00:00Z"}"#;
    let peers = parse_lease_list(one(&meta, spec).as_bytes(), &Own::default(), &[]).unwrap();
    assert_eq!(peers[0].expires_ms, Some(T0 - 10_000));
    let spec =
        r#"{"holderIdentity":"x_1","leaseDurationSeconds":-9000000000000000000,"renewTime":"2026-07-23T10:00:00Z"}"#;
    let peers = parse_lease_list(one(&meta, spec).as_bytes(), &Own::default(), &[]).unwrap();
    assert_eq!(peers[0].expires_ms, Some(0));
}

#[test]
fn rfc3339_basics_and_fractions() {
    assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.000000Z"), Some(0));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00.000000Z"), Some(T0));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00Z"), Some(T0));
    assert_eq!(parse_rfc3339_ms("2026-07-23t10:00:00z"), Some(T0));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00.5Z"), Some(T0 + 500));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00.05Z"), Some(T0 + 50));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00.123456Z"), Some(T0 + 123));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00.999999999Z"), Some(T0 + 999));
    assert_eq!(parse_rfc3339_ms("2001-09-09T01:46:40Z"), Some(1_000_000_000_000));
    assert_eq!(parse_rfc3339_ms("9999-12-31T23:59:59.999Z"), Some(253_402_300_799_999));
}

#[test]
fn rfc3339_offsets() {
    assert_eq!(parse_rfc3339_ms("2026-07-23T12:00:00+02:00"), Some(T0));
    assert_eq!(parse_rfc3339_ms("2026-07-23T12:00:00.250000+02:00"), Some(T0 + 250));
    assert_eq!(parse_rfc3339_ms("2026-07-23T04:30:00-05:30"), Some(T0));
    assert_eq!(parse_rfc3339_ms("2026-07-24T09:59:00+23:59"), Some(T0));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00+00:00"), Some(T0));
    assert_eq!(parse_rfc3339_ms("2026-07-23T10:00:00-00:00"), Some(T0));
    // Crossing the epoch through the offset.
    assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00+01:00"), Some(0));
    assert_eq!(parse_rfc3339_ms("1970-01-01T00:59:59+01:00"), None);
    assert_eq!(parse_rfc3339_ms("1969-12-31T23:00:00-01:00"), Some(0));
}

#[test]
fn rfc3339_leap_years() {
    let day = 86_400_000;
    assert_eq!(parse_rfc3339_ms("2024-02-29T00:00:00Z"), Some(1_709_164_800_000));
    assert_eq!(
        parse_rfc3339_ms("2024-03-01T00:00:00Z").unwrap() - parse_rfc3339_ms("2024-02-28T00:00:00Z").unwrap(),
        2 * day
    );
    assert_eq!(parse_rfc3339_ms("2000-02-29T00:00:00Z"), Some(951_782_400_000));
    assert_eq!(parse_rfc3339_ms("2400-02-29T00:00:00Z"), Some(13_574_563_200_000));
    assert_eq!(parse_rfc3339_ms("2023-02-29T00:00:00Z"), None);
    assert_eq!(parse_rfc3339_ms("2100-02-29T00:00:00Z"), None);
    assert_eq!(parse_rfc3339_ms("1900-02-29T00:00:00Z"), None);
    assert_eq!(
        parse_rfc3339_ms("2026-12-31T00:00:00Z").unwrap() - parse_rfc3339_ms("2026-01-01T00:00:00Z").unwrap(),
        364 * day
    );
    assert_eq!(
        parse_rfc3339_ms("2028-12-31T00:00:00Z").unwrap() - parse_rfc3339_ms("2028-01-01T00:00:00Z").unwrap(),
        365 * day
    );
}

#[test]
fn rfc3339_before_1970_and_garbage() {
    for s in [
        "1969-12-31T23:59:59Z",
        "1969-12-31T23:59:59.999Z",
        "0000-01-01T00:00:00Z",
        "1900-01-01T00:00:00Z",
        "",
        "garbage",
        "2026-07-23",
        "2026-07-23T10:00:00",
        "2026-07-23 10:00:00Z",
        "2026-07-23T10:00Z",
        "2026-07-23T10:00:00.Z",
        "2026-07-23T10:00:00.12a4Z",
        "2026-07-23T10:00:00ZZ",
        "2026-07-23T10:00:00Z ",
        " 2026-07-23T10:00:00Z",
        "2026-07-23T10:00:00+0200",
        "2026-07-23T10:00:00+02",
        "2026-07-23T10:00:00+24:00",
        "2026-07-23T10:00:00+02:60",
        "2026-13-01T00:00:00Z",
        "2026-00-01T00:00:00Z",
        "2026-01-00T00:00:00Z",
        "2026-04-31T00:00:00Z",
        "2026-07-23T24:00:00Z",
        "2026-07-23T10:60:00Z",
        "2026-12-31T23:59:60Z",
        "+2026-07-23T10:00:00Z",
        "20260-07-23T10:00:00Z",
        "2026-7-23T10:00:00Z",
        "2026-07-23T10:00:00.000000Z\u{0}",
        "２０２６-07-23T10:00:00Z",
        "2026-07-23T10:00:00\u{00e9}",
    ] {
        assert_eq!(parse_rfc3339_ms(s), None, "{s:?}");
    }
}

#[test]
fn addresses_valid_and_canonical() {
    assert_eq!(parse_address("10.0.0.1:6443").as_deref(), Some("10.0.0.1:6443"));
    assert_eq!(parse_address("127.0.0.1:1").as_deref(), Some("127.0.0.1:1"));
    assert_eq!(parse_address("1.2.3.4:65535").as_deref(), Some("1.2.3.4:65535"));
    assert_eq!(parse_address("1.2.3.4:0443").as_deref(), Some("1.2.3.4:443"));
    assert_eq!(parse_address("[::1]:443").as_deref(), Some("[::1]:443"));
    assert_eq!(
        parse_address("[2001:DB8:0:0:0:0:0:1]:6443").as_deref(),
        Some("[2001:db8::1]:6443")
    );
    assert_eq!(
        parse_address("[fd00:0:0:1::]:6443").as_deref(),
        Some("[fd00:0:0:1::]:6443")
    );
    assert_eq!(
        parse_address("[::ffff:10.0.0.1]:6443").as_deref(),
        Some("[::ffff:10.0.0.1]:6443")
    );
}

#[test]
fn addresses_invalid() {
    for s in [
        "host:443",
        "cp-a.example.com:6443",
        "1.2.3.4",
        "1.2.3.4:",
        "1.2.3.4:0",
        "1.2.3.4:00000",
        "1.2.3.4:70000",
        "1.2.3.4:65536",
        "1.2.3.4:443000",
        "1.2.3.4:+443",
        "1.2.3.4:-1",
        "1.2.3.4:44 3",
        "1.2.3.4:443:1",
        " 1.2.3.4:443",
        "1.2.3.4:443 ",
        "1.2.3:443",
        "1.2.3.256:443",
        "01.2.3.4:443",
        "[::1]",
        "[::1]:",
        "[::1]:0",
        "[::1]:70000",
        "::1:443",
        "[::1:443",
        "::1]:443",
        "[1.2.3.4]:443",
        "[fe80::1%eth0]:443",
        "[[::1]]:443",
        "[host]:443",
        "0.0.0.0:6443",
        "[::]:6443",
        "224.0.0.1:6443",
        "255.255.255.255:6443",
        "[ff02::1]:6443",
        "",
        ":443",
        "[]:443",
    ] {
        assert_eq!(parse_address(s), None, "{s:?}");
    }
}

#[test]
fn diff_added_removed_restarted() {
    let old = vec![peer("a", "a_1"), peer("b", "b_1"), peer("c", "c_1")];
    let new = vec![peer("d", "d_1"), peer("b", "b_2"), peer("a", "a_1")];
    assert_eq!(
        diff(&old, &new),
        Changes {
            added: vec!["d".into()],
            removed: vec!["c".into()],
            restarted: vec!["b".into()]
        }
    );
    assert_eq!(diff(&old, &old), Changes::default());
    assert_eq!(diff(&[], &[]), Changes::default());
    assert_eq!(
        diff(&[], &old),
        Changes {
            added: vec!["a".into(), "b".into(), "c".into()],
            removed: vec![],
            restarted: vec![]
        }
    );
    assert_eq!(
        diff(&old, &[]),
        Changes {
            added: vec![],
            removed: vec!["a".into(), "b".into(), "c".into()],
            restarted: vec![]
        }
    );
    // Only the holder matters: a moved address or a renewal is no change.
    let mut renewed = old.clone();
    renewed[0].expires_ms = Some(1);
    renewed[1].address = Some("10.0.0.9:6443".into());
    assert_eq!(diff(&old, &renewed), Changes::default());
}

#[test]
fn diff_of_parsed_lists_sees_a_restart() {
    let before = parse_lease_list(LIST.as_bytes(), &own_a(), &[]).unwrap();
    let restarted = LIST.replace("000000000002", "00000000000f");
    let after = parse_lease_list(restarted.as_bytes(), &own_a(), &[]).unwrap();
    assert_eq!(
        diff(&before, &after),
        Changes {
            added: vec![],
            removed: vec![],
            restarted: vec!["apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa".into()]
        }
    );
}

#[test]
fn list_shapes_accepted() {
    let empty = [
        r#"{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[]}"#,
        r#"{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{},"items":null}"#,
        r#"{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{}}"#,
        r#"{"kind":"List","items":[]}"#,
        r#"{"items":[]}"#,
        r#"  {"items":[],"unknown":{"x":[1,2,3]}}  "#,
    ];
    for body in empty {
        assert_eq!(
            parse_lease_list(body.as_bytes(), &Own::default(), &[]),
            Ok(vec![]),
            "{body}"
        );
    }
}

#[test]
fn non_list_bodies_are_rejected() {
    let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"leases.coordination.k8s.io is forbidden","reason":"Forbidden","code":403}"#;
    let lease = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/k8s-discovery/roundtrip_coordination.k8s.io.v1.Lease.json"
    ))
    .unwrap();
    let bodies: Vec<&[u8]> = vec![
        status.as_bytes(),
        &lease,
        b"",
        b"   ",
        b"null",
        b"[]",
        br#"["LeaseList", []]"#,
        b"\"LeaseList\"",
        b"42",
        b"{",
        b"{}",
        br#"{"kind":null}"#,
        br#"{"kind":"List"}"#,
        br#"{"kind":"LeaseList","items":{}}"#,
        br#"{"kind":"LeaseList","items":[1]}"#,
        br#"{"kind":"LeaseList","items":[{"metadata":{"name":7}}]}"#,
        br#"{"kind":"LeaseList","items":[{"metadata":{"labels":{"a":null}}}]}"#,
        br#"{"kind":"LeaseList","items":[{"spec":{"leaseDurationSeconds":"3600"}}]}"#,
        br#"{"kind":"LeaseList","items":[{"spec":{"leaseDurationSeconds":3600.5}}]}"#,
        br#"{"kind":"LeaseList","items":[]} trailing"#,
        b"\xff\xfe{}",
        b"<html>503 Service Unavailable</html>",
    ];
    for body in bodies {
        let err = parse_lease_list(body, &Own::default(), &[]).unwrap_err();
        assert!(err.starts_with("lease list: "), "{err}");
    }
    let err = parse_lease_list(status.as_bytes(), &Own::default(), &[]).unwrap_err();
    assert!(err.contains("Status"), "{err}");
}

#[test]
fn roundtrip_fixture_as_a_list_item_uses_the_real_field_names() {
    // The upstream roundtrip fixture has placeholder values but every real field name: relabel it
    // as an identity lease and it parses.
    let lease = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/k8s-discovery/roundtrip_coordination.k8s.io.v1.Lease.json"
    ))
    .unwrap()
    .replace(
        r#""labelsKey": "labelsValue""#,
        r#""apiserver.kubernetes.io/identity": "kube-apiserver""#,
    )
    .replace(
        r#""annotationsKey": "annotationsValue""#,
        r#""kubernetes.io/peer-advertise-address": "10.0.0.7:6443""#,
    );
    let body =
        format!(r#"{{"kind":"LeaseList","apiVersion":"coordination.k8s.io/v1","metadata":{{}},"items":[{lease}]}}"#);
    let peers = parse_lease_list(body.as_bytes(), &Own::default(), &[]).unwrap();
    assert_eq!(
        peers,
        vec![LeasePeer {
            id: "nameValue".into(),
            holder: "holderIdentityValue".into(),
            hostname: String::new(),
            address: Some("10.0.0.7:6443".into()),
            // renewTime 2004-01-01T01:01:01.000004Z + 2 s.
            expires_ms: Some(1_072_918_861_000 + 2_000),
        }]
    );
}

/// A list counts only if it lists this server's own valid identity lease (see `Members`): one
/// without it is in a layout the filter does not know, or `Own` is misconfigured, and may lack
/// other servers too.
#[test]
fn members_say_whether_this_servers_own_lease_was_listed() {
    let m = parse_lease_members(LIST.as_bytes(), &own_a(), &[], None).unwrap();
    assert!(m.own_listed);
    assert_eq!(m.peers, parse_lease_list(LIST.as_bytes(), &own_a(), &[]).unwrap());
    // By address, as advertised or as resolved through hosts.
    let by_address = |a: &str| Own {
        hostname: None,
        address: Some(a.into()),
    };
    assert!(
        parse_lease_members(LIST.as_bytes(), &by_address("10.0.0.2:6443"), &[], None)
            .unwrap()
            .own_listed
    );
    let resolved = hosts(&[("cp-c", "10.0.0.3:6443")]);
    assert!(
        parse_lease_members(LIST.as_bytes(), &by_address("10.0.0.3:6443"), &resolved, None)
            .unwrap()
            .own_listed
    );
    // Not listed: another hostname or address, no identification at all, or an empty list.
    for own in [
        Own {
            hostname: Some("cp-z".into()),
            address: None,
        },
        by_address("10.9.9.9:6443"),
        by_address("10.0.0.3:6443"),
        Own::default(),
    ] {
        let m = parse_lease_members(LIST.as_bytes(), &own, &[], None).unwrap();
        assert!(!m.own_listed, "{own:?}");
        assert_eq!(m.peers.len(), 3, "{own:?}: still parsed; the caller decides");
    }
    let empty = r#"{"kind":"LeaseList","items":null}"#;
    assert_eq!(
        parse_lease_members(empty.as_bytes(), &own_a(), &[], None),
        Ok(Members::default())
    );
    // Its own lease must be a valid identity lease: another label value (a future layout) or no
    // holder is not it.
    let relabeled = LIST.replacen(
        r#""apiserver.kubernetes.io/identity": "kube-apiserver""#,
        r#""apiserver.kubernetes.io/identity": "kube-apiserver-v2""#,
        1,
    );
    assert_ne!(relabeled, LIST);
    let m = parse_lease_members(relabeled.as_bytes(), &own_a(), &[], None).unwrap();
    assert!(!m.own_listed);
    assert_eq!(
        ids(&m.peers),
        [
            "apiserver-b2pxk7zq4mlw3t5y6u7i8o9pqa",
            "apiserver-c3qyl8ar5nmx4u6z7v8j9p0qrb"
        ]
    );
    let unheld = one(&identity_meta("apiserver-a", "cp-a", "{}"), r#"{"holderIdentity":""}"#);
    assert!(
        !parse_lease_members(unheld.as_bytes(), &own_a(), &[], None)
            .unwrap()
            .own_listed
    );
    let held = one(
        &identity_meta("apiserver-a", "cp-a", "{}"),
        r#"{"holderIdentity":"apiserver-a_1"}"#,
    );
    let m = parse_lease_members(held.as_bytes(), &own_a(), &[], None).unwrap();
    assert!(m.own_listed && m.peers.is_empty());
}
