//! The few host calls the adapters need, wrapped so that no host failure or odd input (invalid
//! UTF-8 in a header, a missing property) can panic the VM.

use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType};

use crate::metrics;

/// The host's clock, ms since the epoch (0 if the host refuses). Read straight from the ABI: the
/// SDK's `SystemTime` and `u128` arithmetic cost more than the call on the request path.
pub fn now_ms() -> u64 {
    let mut ns: u64 = 0;
    // SAFETY: the host writes one u64 at the pointer given.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut ns) };
    if status != 0 {
        return 0;
    }
    ns / 1_000_000
}

/// A header value as text; invalid UTF-8 is replaced rather than trusted. `None` also when the
/// host refuses (the SDK's `get_map_value_bytes` would panic, e.g. on request headers read after
/// they are gone).
pub fn header(map: MapType, name: &str) -> Option<String> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: the host writes a buffer it allocated through the SDK's `proxy_on_memory_allocate`
    // (a `Vec` allocation of `size` bytes), which we take ownership of exactly once.
    let status = unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size) };
    if status != 0 {
        return None;
    }
    if data.is_null() {
        return Some(String::new());
    }
    let bytes = unsafe { Vec::from_raw_parts(data, size, size) };
    // The host's buffer becomes the String: no second copy unless it needs replacing.
    Some(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

// The SDK's header hostcalls panic when the host refuses (e.g. request headers touched in the
// response phase); these are the same ABI imports, with the status returned instead.
extern "C" {
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_get_header_map_pairs(map_type: MapType, return_map_data: *mut *mut u8, return_map_size: *mut usize)
        -> u32;
    fn proxy_get_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: MapType, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_add_header_map_value(
        map_type: MapType,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
}

/// Adds a header line (one more value for a repeated header); returns whether the host accepted it.
pub fn add_header(map: MapType, name: &str, value: &str) -> bool {
    // SAFETY: pointers and lengths come from live `&str`s; the host copies the bytes.
    let status = unsafe { proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
    status == 0
}

/// Sets (or with `None` removes) a header; returns whether the host accepted it.
pub fn set_header(map: MapType, name: &str, value: Option<&str>) -> bool {
    // SAFETY: pointers and lengths come from live `&str`s; the host copies the bytes.
    let status = unsafe {
        match value {
            Some(v) => proxy_replace_header_map_value(map, name.as_ptr(), name.len(), v.as_ptr(), v.len()),
            None => proxy_remove_header_map_value(map, name.as_ptr(), name.len()),
        }
    };
    if status != 0 {
        log::debug!("kube-peer-proxy: the host refused setting header {name} (status {status})");
    }
    status == 0
}

pub fn headers(map: MapType) -> Vec<(String, String)> {
    hostcalls::get_map_bytes(map)
        .map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Every header of `map` as the host serializes them (see [`crate::header_map`]), in one buffer:
/// empty if the host refuses.
pub fn header_pairs(map: MapType) -> Vec<u8> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: as in `header`: a buffer the host allocated through `proxy_on_memory_allocate`.
    let status = unsafe { proxy_get_header_map_pairs(map, &mut data, &mut size) };
    if status != 0 || data.is_null() {
        return Vec::new();
    }
    unsafe { Vec::from_raw_parts(data, size, size) }
}

pub fn buffer(kind: BufferType, size: usize) -> Vec<u8> {
    hostcalls::get_buffer(kind, 0, size).ok().flatten().unwrap_or_default()
}

pub fn property(path: &[&str]) -> Option<String> {
    hostcalls::get_property(path.to_vec())
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Shared data value, or None if absent or unreadable.
pub fn shared(key: &str) -> Option<Vec<u8>> {
    hostcalls::get_shared_data(key).ok().and_then(|(v, _)| v)
}

/// The CAS of a shared-data entry (see [`crate::snapshot::KEY_PUBLISHED`]), or None if absent.
pub fn shared_cas(key: &str) -> Option<u32> {
    hostcalls::get_shared_data(key).ok().and_then(|(_, cas)| cas)
}

/// A shared-data value written as a decimal number (generation, down marks).
pub fn shared_u64(key: &str) -> Option<u64> {
    shared(key).and_then(|b| std::str::from_utf8(&b).ok()?.parse().ok())
}

pub fn set_shared(key: &str, value: &[u8]) -> bool {
    match hostcalls::set_shared_data(key, Some(value), None) {
        Ok(()) => true,
        Err(e) => {
            log::error!("writing shared data {key}: {e:?}");
            false
        }
    }
}

/// Metric ids by full name, defined on first use. Envoy's `define_metric` returns a new id on every
/// call (for the same stat), so ids are cached per name; labelled counters are found by their label
/// values ([`metrics::LabelledIds`]), so a request formats no metric name once its label set was seen.
#[derive(Default)]
pub struct Metrics {
    ids: HashMap<(MetricKind, String), u32>,
    labelled: metrics::LabelledIds,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricKind {
    Counter,
    Gauge,
}

fn define(kind: MetricKind, name: &str) -> Option<u32> {
    let t = match kind {
        MetricKind::Counter => MetricType::Counter,
        MetricKind::Gauge => MetricType::Gauge,
    };
    match hostcalls::define_metric(t, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("define_metric {name}: {e:?}");
            None
        }
    }
}

impl Metrics {
    fn id(&mut self, kind: MetricKind, name: String) -> Option<u32> {
        if let Some(id) = self.ids.get(&(kind, name.clone())) {
            return Some(*id);
        }
        let id = define(kind, &name)?;
        self.ids.insert((kind, name), id);
        Some(id)
    }

    /// Counter `base` with `labels` (see [`crate::metrics::name`]) incremented by one.
    pub fn inc_labelled(&mut self, base: &str, labels: &[(&str, &str)]) {
        if let Some(id) = self.labelled.id(base, labels, |name| define(MetricKind::Counter, name)) {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    pub fn inc(&mut self, name: String) {
        if let Some(id) = self.id(MetricKind::Counter, name) {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    pub fn set(&mut self, name: String, value: u64) {
        if let Some(id) = self.id(MetricKind::Gauge, name) {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}

/// The filter's request phases, marked for `bench/req_probe.py` (which counts the wasm
/// instructions between marks): a build with the `phase-marks` feature imports `kpp_phase_mark`;
/// the shipped build has no import and no call.
#[derive(Clone, Copy)]
pub enum Phase {
    Start = 1,
    Admitted = 2,
    HeadersRead = 3,
    TableRead = 4,
    Routed = 5,
    Acted = 6,
}

#[cfg(feature = "phase-marks")]
pub fn mark(phase: Phase) {
    extern "C" {
        fn kpp_phase_mark(phase: u32);
    }
    // SAFETY: an import of the probe's host taking one i32.
    unsafe { kpp_phase_mark(phase as u32) }
}

#[cfg(not(feature = "phase-marks"))]
#[inline(always)]
pub fn mark(_phase: Phase) {}
