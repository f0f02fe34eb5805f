"""Real control plane fixtures: etcd + kube-apiservers built by scripts/k8s/build.sh (cached under
~/.cache/kube-peer-proxy), an Envoy with the filter in front of each server. The Makefile decides
whether these tests run at all (`make e2e-k8s` builds what is missing first); here a missing binary
is an error, never a skip."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from k8senv import A_RUNTIME_CONFIG, DEFAULT_VERSION, start_env, stop_env


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        env = getattr(item.session, "kpp_env", None)
        if env is not None:
            report.sections.append(("kube-peer-proxy control plane logs", env.dump()))


@pytest.fixture(scope="session")
def env(request, tmp_path_factory):
    """a: v1.36.3 without batch/v1 and autoscaling/v2; b: v1.36.3 serving everything."""
    e = start_env(tmp_path_factory.mktemp("k8s"),
                  [("a", DEFAULT_VERSION, A_RUNTIME_CONFIG), ("b", DEFAULT_VERSION, "")])
    request.session.kpp_env = e
    yield e
    stop_env(e)
