"""kpp.render (python/kpp/render.py) copies a few names from the Rust code (it must, to render a bootstrap
the filter agrees with); this test reads them back out of src/ so a rename on one side cannot go unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

from kpp import render

SRC = Path(__file__).resolve().parents[2] / "src"


def rust_const(file: str, name: str) -> str:
    m = re.search(rf'const {name}: &str = "([^"]*)";', (SRC / file).read_text())
    assert m, f"{name} not found in src/{file}"
    return m.group(1)


def test_render_constants_match_the_rust_code():
    assert render.DISCOVERY_ROOT_ID == rust_const("config.rs", "DISCOVERY_ROOT_ID")
    assert render.FILTER_REPLY_HEADER == rust_const("request/reply.rs", "FILTER_REPLY_HEADER")
    default_route = re.search(r'route_header: "([^"]*)"\.into\(\)', (SRC / "config.rs").read_text()).group(1)
    assert render.ROUTE_HEADER == default_route
    labels = re.search(r"pub const LABELS: &\[&str\] = &\[([^\]]*)\];", (SRC / "metrics.rs").read_text()).group(1)
    assert render.LABELS == re.findall(r'"([^"]*)"', labels)
    # The filter's root id is whatever is not the discovery service's; the vm_id must be shared.
    assert render.FILTER_ROOT_ID != render.DISCOVERY_ROOT_ID and render.VM_ID
