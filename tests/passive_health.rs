//! Passive health's mark, read and clear (src/passive_health.rs), with shared data as a map.
#![cfg(test)]

use std::collections::HashMap;

use kube_peer_proxy::passive_health::{down_key, is_down, is_marked, mark_value, recovered, CLEARED};
use kube_peer_proxy::snapshot::{ServerRef, Table};

fn server(name: &str, local: bool, address: Option<&str>) -> ServerRef {
    ServerRef {
        name: name.into(),
        cluster: format!("{name}-cluster"),
        local,
        address: address.map(str::to_string),
    }
}

fn table() -> Table {
    Table {
        servers: vec![
            server("a", true, None),
            server("b", false, None),
            server("c", false, Some("10.0.0.3:6443")),
        ],
        ..Table::default()
    }
}

/// Shared data with decimal values, as the adapters read it (`host::shared_u64`).
fn reader(data: &HashMap<String, Vec<u8>>) -> impl FnMut(&str) -> Option<u64> + '_ {
    move |key| std::str::from_utf8(data.get(key)?).ok()?.parse().ok()
}

#[test]
fn a_mark_is_keyed_by_target_and_asked_by_table_index() {
    let t = table();
    let mut data = HashMap::new();
    // A lease peer is marked by its address, a configured one by its cluster.
    data.insert(down_key("10.0.0.3:6443"), mark_value(1_000).into_bytes());
    data.insert(down_key("b-cluster"), CLEARED.to_vec());
    let down = |data: &HashMap<String, Vec<u8>>, t: Option<&Table>| -> Vec<bool> {
        (0..4).map(|i| is_down(t, i, &mut reader(data))).collect()
    };
    assert_eq!(down(&data, Some(&t)), [false, false, true, false]);
    data.insert(down_key("b-cluster"), mark_value(2_000).into_bytes());
    assert_eq!(down(&data, Some(&t)), [false, true, true, false]);
    assert_eq!(down(&data, None), [false; 4]);
    assert!(!is_marked(None));
    assert!(!is_marked(Some(0)));
    assert!(is_marked(Some(1)));
}

#[test]
fn a_mark_is_cleared_only_by_an_answer_after_it() {
    let mut data = HashMap::new();
    data.insert(down_key("b-cluster"), mark_value(5_000).into_bytes());
    data.insert(down_key("c-cluster"), mark_value(5_000).into_bytes());
    let answering = [("a-cluster", 9_000), ("b-cluster", 6_000), ("c-cluster", 4_000)];
    let cleared = recovered(answering.into_iter(), &mut reader(&data));
    assert_eq!(cleared, vec![("b-cluster", down_key("b-cluster"))]);
}

#[test]
fn a_mark_and_its_clearing_hold_from_the_next_question_on() {
    // No worker caches marks: what one worker writes (or the service clears) is the next answer of
    // every worker, so a dead peer fails one request in the cluster, not one per worker.
    let t = table();
    let mut data = HashMap::new();
    assert!(!is_down(Some(&t), 1, &mut reader(&data)));
    data.insert(down_key("b-cluster"), mark_value(1).into_bytes());
    assert!(is_down(Some(&t), 1, &mut reader(&data)));
    data.insert(down_key("b-cluster"), CLEARED.to_vec());
    assert!(!is_down(Some(&t), 1, &mut reader(&data)));
}
