//! Test-only proxy-wasm filter: adds `x-crash-filter-vm: <id of this VM>` to every response and traps (panics,
//! `panic = "abort"`) on a request that carries `x-crash-vm`, so a test can watch Envoy's `failure_policy`.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { vm: String::new() }) });
}}

struct Root {
    vm: String,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_vm_start(&mut self, _: usize) -> bool {
        // Nanoseconds at VM start tell VMs apart.
        let now = self.get_current_time();
        let nanos = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        self.vm = format!("{nanos:x}");
        true
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request { vm: self.vm.clone() }))
    }
}

struct Request {
    vm: String,
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        if self.get_http_request_header("x-crash-vm").is_some() {
            panic!("crash requested by x-crash-vm");
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        self.set_http_response_header("x-crash-filter-vm", Some(&self.vm));
        Action::Continue
    }
}
