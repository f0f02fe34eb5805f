//! The ABI's serialized header map read in place: every pair in order, names and values with any
//! bytes, an empty map, and damage that stops the reading instead of panicking or inventing pairs.
#![cfg(test)]

use kube_peer_proxy::header_map::{pairs, serialize};

#[test]
fn pairs_round_trip() {
    let maps: [&[(&[u8], &[u8])]; 4] = [
        &[],
        &[
            (b":path", b"/api/v1/pods"),
            (b":method", b"GET"),
            (b"x-remote-user", b""),
        ],
        &[(b"", b""), (b"a", b"\0\xff"), (b"\xc3\xa9", b"v")],
        &[(&b"accept"[..], &b"application/json"[..]); 40],
    ];
    for map in maps {
        let bytes = serialize(map);
        let got: Vec<(&[u8], &[u8])> = pairs(&bytes).collect();
        assert_eq!(got, map.to_vec());
    }
}

#[test]
fn damage_stops_the_reading() {
    let whole = serialize(&[(b"x-remote-user", b"admin"), (b"accept", b"*/*")]);
    // Cut anywhere: the pairs read are the whole's first ones; a cut into the last value (its
    // closing NUL aside, which the reader does not need) loses that pair.
    let all: Vec<(&[u8], &[u8])> = pairs(&whole).collect();
    for cut in 0..whole.len() {
        let got: Vec<(&[u8], &[u8])> = pairs(&whole[..cut]).collect();
        assert_eq!(got[..], all[..got.len()], "cut at {cut}");
        if cut < whole.len() - 1 {
            assert!(got.len() < all.len(), "cut at {cut}: {got:?}");
        }
    }
    // A count far past the data, and sizes past the end.
    assert_eq!(pairs(&u32::MAX.to_le_bytes()).count(), 0);
    let mut big = whole.clone();
    big[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(pairs(&big).count(), 0);
    assert_eq!(pairs(&[]).count(), 0);
}
