"""Fixtures for the e2e tests: Envoys that are always stopped, and whose logs
are printed when the test fails (the log is usually the only clue)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kpp.testing import harness

FAILURE_LOG_LINES = 300


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # Stash each phase's report on the item so fixture teardown can tell
    # whether the test failed.
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


class EnvoyRegistry:
    """Starts Envoys for one test and remembers them for teardown."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.started: list[harness.Envoy] = []

    def start(
        self,
        config_yaml: str,
        name: str,
        admin_port: int,
        wait_ready: bool = True,
        timeout: float = 30.0,
        **envoy_kwargs,
    ) -> harness.Envoy:
        envoy_kwargs.setdefault("workdir", self.base_dir / f"envoy-{name}")
        envoy = harness.Envoy(config_yaml, name, admin_port, **envoy_kwargs)
        # Register before starting: a start that fails still leaves a log
        # worth printing.
        self.started.append(envoy)
        return envoy.start(wait_ready=wait_ready, timeout=timeout)

    def stop_all(self) -> None:
        for envoy in self.started:
            envoy.stop()

    def dump_logs(self) -> None:
        for envoy in self.started:
            print(f"\n===== envoy {envoy.name} ({envoy.log_path}), last {FAILURE_LOG_LINES} lines =====")
            print(envoy.log_tail(FAILURE_LOG_LINES), end="")


@pytest.fixture
def tmp_workdir(tmp_path: Path) -> Path:
    workdir = tmp_path / "work"
    workdir.mkdir()
    return workdir


@pytest.fixture
def envoys(request, tmp_path: Path):
    registry = EnvoyRegistry(tmp_path)
    yield registry
    try:
        registry.stop_all()
    finally:
        # Also when stopping fails or the test's timeout (pytest.ini) interrupts it.
        reports = (getattr(request.node, "rep_setup", None), getattr(request.node, "rep_call", None))
        if any(r is not None and r.failed for r in reports):
            # Printed in teardown, pytest shows it as "Captured stdout teardown"
            # under the failure.
            registry.dump_logs()


@pytest.fixture
def topo(envoys):
    """The demo topology (fake apiservers a old, b and c new, one Envoy in front of a), always closed."""
    from kpp.testing.topology import Topology

    t = Topology(envoys)
    yield t
    t.close()
