//! The wasm floor of `make bench` (scenario a'): what running *any* proxy-wasm filter in Envoy
//! costs. The plugin configuration picks one probe, so the benchmark can also price single host
//! calls (each probe = the floor plus one kind of work the real filter does per request). A probe
//! named `<probe>x<N>` does its work N times per request, so one call's cost stands out of the
//! run-to-run noise: (probe − floor) / N.
//!
//! - `path`: read `:path`, continue. The floor itself.
//! - `headers6`: six request-header reads one by one (what kube-peer-proxy 0.1.0 did per request).
//! - `map`: one `get_http_request_headers` (every request header in one call).
//! - `shared`: `:path` and one read of a small shared-data key.
//! - `status`: `:path`, and `:status` read on the response.
//! - `foreign`: `:path`, and Envoy's `clear_route_cache` foreign function (the reroute's re-pick).
//! - `property`: `:path`, and `response.code_details` read on the response.
//! - `metric-name`: `:path`, and a counter incremented by label-encoded name (formatted per request,
//!   looked up in a map).
//! - `metric-id`: `:path`, and a counter incremented by an id resolved once.
//! - `absent`: `:path`, and a read of a request header the request does not have (the filter's
//!   route-header and `x-kubernetes-peer-proxied` reads).
//! - `published`: `:path`, and a read of a shared-data key with an empty value under a short key
//!   (the filter's per-request `snapshot::KEY_PUBLISHED` read: only its CAS comes back).
//! - `pairs`: `:path`, and every request header in one `proxy_get_header_map_pairs`, read in place
//!   (no copy per header; the filter's client-identity scan).

use std::collections::HashMap;

extern "C" {
    fn proxy_get_header_map_pairs(map_type: MapType, return_map_data: *mut *mut u8, return_map_size: *mut usize)
        -> u32;
}

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType, MetricType};

#[derive(Clone, Copy, PartialEq)]
enum Probe {
    Path,
    Headers6,
    Map,
    Shared,
    Status,
    Foreign,
    Property,
    MetricName,
    MetricId,
    Absent,
    Published,
    Pairs,
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { probe: Probe::Path, times: 1, metric: 0 }) });
}}

struct Root {
    probe: Probe,
    times: u32,
    metric: u32,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = hostcalls::get_buffer(proxy_wasm::types::BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (name, times) = match raw.rsplit_once('x') {
            Some((n, t)) if t.parse::<u32>().is_ok_and(|t| t > 0) => (n.to_string(), t.parse().unwrap_or(1)),
            _ => (raw.clone(), 1),
        };
        self.times = times;
        self.probe = match name.as_bytes() {
            b"" | b"path" => Probe::Path,
            b"headers6" => Probe::Headers6,
            b"map" => Probe::Map,
            b"shared" => Probe::Shared,
            b"status" => Probe::Status,
            b"foreign" => Probe::Foreign,
            b"property" => Probe::Property,
            b"metric-name" => Probe::MetricName,
            b"metric-id" => Probe::MetricId,
            b"absent" => Probe::Absent,
            b"published" => Probe::Published,
            b"pairs" => Probe::Pairs,
            other => {
                log::error!("noop: unknown probe {:?}", String::from_utf8_lossy(other));
                return false;
            }
        };
        if self.probe == Probe::Shared {
            let _ = hostcalls::set_shared_data("kpp-bench-noop/generation", Some(b"12"), None);
        }
        if self.probe == Probe::Published {
            let _ = hostcalls::set_shared_data("kpp.noop/pub", Some(b""), None);
        }
        if self.probe == Probe::MetricId {
            self.metric = hostcalls::define_metric(MetricType::Counter, "kpp_bench_noop_total;code=200").unwrap_or(0);
        }
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter {
            probe: self.probe,
            times: self.times,
            metric: self.metric,
            names: HashMap::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Filter {
    probe: Probe,
    times: u32,
    metric: u32,
    names: HashMap<String, u32>,
}

impl Context for Filter {}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let req = MapType::HttpRequestHeaders;
        let _ = hostcalls::get_map_value_bytes(req, ":path");
        for _ in 0..self.times {
            self.request_work();
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        for _ in 0..self.times {
            match self.probe {
                Probe::Status => {
                    let _ = hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, ":status");
                }
                Probe::Property => {
                    let _ = hostcalls::get_property(vec!["response", "code_details"]);
                }
                _ => {}
            }
        }
        Action::Continue
    }
}

impl Filter {
    fn request_work(&mut self) {
        let req = MapType::HttpRequestHeaders;
        match self.probe {
            Probe::Headers6 => {
                for name in [
                    ":method",
                    ":path",
                    "accept",
                    "x-kubernetes-peer-proxied",
                    "x-kube-peer-proxy-route",
                    "if-none-match",
                ] {
                    let _ = hostcalls::get_map_value_bytes(req, name);
                }
            }
            Probe::Map => {
                let _ = hostcalls::get_map_bytes(req);
            }
            Probe::Absent => {
                let _ = hostcalls::get_map_value_bytes(req, "x-kubernetes-peer-proxied");
            }
            Probe::Pairs => {
                let mut data: *mut u8 = std::ptr::null_mut();
                let mut size: usize = 0;
                // SAFETY: the host writes a buffer it allocated with proxy_on_memory_allocate (a Vec of
                // `size` bytes), owned here exactly once.
                let status = unsafe { proxy_get_header_map_pairs(req, &mut data, &mut size) };
                if status == 0 && !data.is_null() {
                    let pairs = unsafe { Vec::from_raw_parts(data, size, size) };
                    std::hint::black_box(pairs);
                }
            }
            _ => {}
        }
        match self.probe {
            Probe::Shared => {
                let _ = hostcalls::get_shared_data("kpp-bench-noop/generation");
            }
            Probe::Published => {
                let _ = hostcalls::get_shared_data("kpp.noop/pub");
            }
            Probe::Foreign => {
                let _ = hostcalls::call_foreign_function("clear_route_cache", None);
            }
            Probe::MetricId => {
                let _ = hostcalls::increment_metric(self.metric, 1);
            }
            Probe::MetricName => {
                let name = format!("kpp_bench_noop_total;code={}", 200);
                let id = match self.names.get(&name) {
                    Some(id) => *id,
                    None => {
                        let id = hostcalls::define_metric(MetricType::Counter, &name).unwrap_or(0);
                        self.names.insert(name, id);
                        id
                    }
                };
                let _ = hostcalls::increment_metric(id, 1);
            }
            _ => {}
        }
    }
}
