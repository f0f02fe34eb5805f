//! Passive health's mark, read and clear (src/passive_health.rs), with shared data as a map.
#![cfg(test)]

use std::collections::HashMap;

use kube_peer_proxy::passive_health::{down_key, is_marked, mark_value, read_marks, recovered, Marks, CLEARED};
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
fn a_mark_is_keyed_by_target_and_read_as_table_bits() {
    let t = table();
    let mut data = HashMap::new();
    // A lease peer is marked by its address, a configured one by its cluster.
    data.insert(down_key("10.0.0.3:6443"), mark_value(1_000).into_bytes());
    data.insert(down_key("b-cluster"), CLEARED.to_vec());
    assert_eq!(read_marks(Some(&t), &mut reader(&data)), 0b100);
    data.insert(down_key("b-cluster"), mark_value(2_000).into_bytes());
    assert_eq!(read_marks(Some(&t), &mut reader(&data)), 0b110);
    assert_eq!(read_marks(None, &mut reader(&data)), 0);
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
fn a_worker_sees_its_own_mark_at_once_and_the_timer_s_read_after() {
    let t = table();
    let mut data = HashMap::new();
    let mut marks = Marks::default();
    // Without the timer, each question reads shared data.
    data.insert(down_key("b-cluster"), mark_value(1).into_bytes());
    assert!(marks.is_down(1, Some(&t), &mut reader(&data)));
    assert!(!marks.is_down(2, Some(&t), &mut reader(&data)));
    assert!(!marks.is_down(7, Some(&t), &mut reader(&data)));
    // With it, only what the timer read (and this worker's own marks) count.
    marks.timer_runs();
    assert!(!marks.is_down(1, Some(&t), &mut reader(&data)));
    marks.load(Some(&t), &mut reader(&data));
    assert!(marks.is_down(1, Some(&t), &mut reader(&data)));
    marks.mark(Some(&t), "10.0.0.3:6443");
    assert!(marks.is_down(2, Some(&t), &mut reader(&data)));
    data.insert(down_key("b-cluster"), CLEARED.to_vec());
    marks.load(Some(&t), &mut reader(&data));
    assert!(!marks.is_down(1, Some(&t), &mut reader(&data)));
    assert!(!marks.is_down(2, Some(&t), &mut reader(&data)));
}
