"""Suite-wide (tests/e2e, tests/fake_apiserver, tests/k8s): a last resort behind pytest-timeout (pytest.ini).

Its "signal" method raises once, in the test, so the fixtures tear down and the logs print. If a teardown then
hangs too (a process or thread that never ends), nothing else would stop the run before CI's own limit, so each
test also arms faulthandler: BACKSTOP seconds after its timeout every thread's stack is printed and the process
exits with status 1.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time

import pytest

BACKSTOP = 120  # seconds past a test's timeout: room for its teardown to stop Envoys and print their logs


def pytest_configure(config):
    # The real stderr, duplicated before pytest captures fd 2 for a test (as pytest's faulthandler plugin does).
    config._kpp_backstop_stderr = os.dup(sys.stderr.fileno())


def pytest_unconfigure(config):
    fd = getattr(config, "_kpp_backstop_stderr", None)
    if fd is not None:
        os.close(fd)


def _timeout(item) -> float:
    """The test's pytest-timeout setting: its mark, else --timeout, else pytest.ini's; 0 for none."""
    mark = item.get_closest_marker("timeout")
    try:
        if mark is not None:
            value = mark.args[0] if mark.args else mark.kwargs.get("timeout")
        else:
            value = item.config.getoption("timeout", None) or item.config.getini("timeout")
        return float(value or 0)
    except (TypeError, ValueError):  # pytest-timeout missing, or a value it would reject itself
        return 0.0


def _arm(item):
    left = item._kpp_backstop_at - time.monotonic()
    faulthandler.dump_traceback_later(max(left, 1.0), exit=True, file=item.config._kpp_backstop_stderr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timeout = _timeout(item)
    if timeout > 0:
        item._kpp_backstop_at = time.monotonic() + timeout + BACKSTOP
        _arm(item)
    try:
        return (yield)
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
            del item._kpp_backstop_at


@pytest.hookimpl(trylast=True)
def pytest_exception_interact(node, call, report):
    # pytest's faulthandler plugin cancels any faulthandler timer when a test fails (before a debugger
    # could start): armed again, so a failed test whose teardown then hangs is still stopped.
    if hasattr(node, "_kpp_backstop_at"):
        _arm(node)
