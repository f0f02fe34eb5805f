"""The version matrix's fixtures: one control plane per step (kpp.testing.versions), chosen by
KPP_VERSION_STEPS (comma-separated step ids; default kpp.testing.versions.DEFAULT_STEPS, "all" for every
step). Run inside kpp.testing.netns (the Makefile's targets do). With KPP_VERSIONS_WRITE=1 the run writes
its results table into docs/versions.md (`make test-versions`)."""

from __future__ import annotations

import datetime
import os
import re
import time
from collections import defaultdict
from pathlib import Path

import pytest

from kpp.testing import versions

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "versions.md"
BEGIN, END = "<!-- versions:begin (tests/versions, make test-versions) -->", "<!-- versions:end -->"


def selected_steps() -> list[str]:
    raw = os.environ.get("KPP_VERSION_STEPS", "").strip()
    if raw == "all":
        return [s.id for s in versions.STEPS]
    ids = [x.strip() for x in raw.split(",") if x.strip()] or list(versions.DEFAULT_STEPS)
    unknown = [i for i in ids if i not in versions.BY_ID]
    if unknown:
        raise pytest.UsageError(f"KPP_VERSION_STEPS: unknown step(s) {unknown}; known: {list(versions.BY_ID)}")
    return ids


def pytest_generate_tests(metafunc):
    if "step" in metafunc.fixturenames:
        metafunc.parametrize("step", selected_steps(), indirect=True, scope="module")


def pytest_configure(config):
    config.addinivalue_line("markers", "membership_steps_only: runs only on the steps with membership=True "
                                       "(the oldest and the newest); deselected, not skipped, on the others")


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        step_id = _step_of(item)
        if step_id and item.get_closest_marker("membership_steps_only") and not versions.BY_ID[step_id].membership:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="module")
def step(request):
    return versions.BY_ID[request.param]


@pytest.fixture(scope="module")
def env(request, step, tmp_path_factory):
    e = versions.StepEnv(tmp_path_factory.mktemp(step.id), step)
    t0 = time.monotonic()
    try:
        e.start()
    except BaseException:
        print(e.dump())
        e.stop()
        raise
    print(f"\n{step.id}: control plane and Envoys up in {time.monotonic() - t0:.1f}s")
    request.session.kpp_env = e
    try:
        yield e
    finally:
        request.session.kpp_env = None
        e.stop()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        env = getattr(item.session, "kpp_env", None)
        if env is not None:
            report.sections.append(("kube-peer-proxy version matrix logs", env.dump()))
    step_id = _step_of(item)
    if step_id and (report.when == "call" or report.failed):
        results = item.config.__dict__.setdefault("_kpp_steps", defaultdict(dict))
        prev = results[step_id].get(item.originalname)
        if prev != "failed":
            results[step_id][item.originalname] = "failed" if report.failed else report.outcome


def _step_of(item) -> str | None:
    cs = getattr(item, "callspec", None)
    return cs.params.get("step") if cs else None


def pytest_sessionfinish(session, exitstatus):
    results = getattr(session.config, "_kpp_steps", None)
    if not results:
        return
    rows = []
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    commit = versions.git_commit(ROOT)
    for s in versions.STEPS:
        if s.id not in results:
            continue
        r = {k: v for k, v in results[s.id].items() if v != "skipped"}  # e.g. membership changes on other steps
        passed = sum(1 for v in r.values() if v == "passed")
        failed = sorted(k for k, v in r.items() if v != "passed")
        rows.append(f"| {s.id} | {s.old.version} → {s.new.version} | {s.proves} | {passed} of {len(r)}"
                    f"{' (FAILED: ' + ', '.join(failed) + ')' if failed else ''} | {today} | {commit} |")
    table = "\n".join(["| step | versions | what it proves | checks passed | date | commit |",
                       "|---|---|---|---|---|---|", *rows])
    diffs = getattr(session.config, "_kpp_diffs", {})
    if diffs:
        drows = []
        for s in versions.STEPS:
            if s.id in diffs:
                fmt = lambda side: ", ".join(k for k, v in versions.aggregated_formats(side).items() if v) or "legacy only"
                drows.append(f"| {s.id} | {fmt(s.old)} → {fmt(s.new)} | {s.old.runtime_config or '-'} | "
                             f"{'<br>'.join(diffs[s.id]['old']) or '-'} | {'<br>'.join(diffs[s.id]['new']) or '-'} |")
        table += "\n\nWhat differed (each server's own discovery, read by the run):\n\n" + "\n".join(
            ["| step | aggregated discovery (old → new) | old server's runtime-config | served only by the old | "
             "served only by the new |", "|---|---|---|---|---|", *drows])
    print("\n" + table)
    if os.environ.get("KPP_VERSIONS_WRITE") == "1":
        text = DOC.read_text()
        new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), BEGIN + "\n" + table + "\n" + END, text, flags=re.S)
        DOC.write_text(new)
