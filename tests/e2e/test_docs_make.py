"""The docs name only make targets and KPP_* variables that exist (scripts/k8s/README.md once named an
`e2e-k8s-if-cached` target and a `KPP_K8S_BUILD` variable that did not)."""

from __future__ import annotations

import re

from kpp.testing import harness

ROOT = harness.ROOT
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("*/README.md")),
        *sorted(ROOT.glob("*/*/README.md")), *sorted(ROOT.glob("python/kpp/**/README.md"))]
CODE_GLOBS = ["Makefile", "scripts/**/*.sh", "scripts/**/*.py", "python/**/*.py", "bench/**/*.py", "bench/**/*.sh",
              "tests/**/*.py", "src/**/*.rs"]


def targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-zA-Z0-9_.-]+)\s*:(?!=)", text, re.M))


def named(text: str) -> set[str]:
    """`make X` in inline code, and lines of code blocks that start with `make X`."""
    out = set(re.findall(r"`make ([a-z][a-z0-9-]*)", text))
    out |= set(re.findall(r"^\s*(?:\$ )?make (?:-s )?([a-z][a-z0-9-]*)", text, re.M))
    return out


def test_every_make_target_the_docs_name_exists():
    have = targets()
    assert {"test", "build", "e2e-k8s", "k8s-build"} <= have, have
    missing = {f"{d.relative_to(ROOT)}: make {t}" for d in DOCS for t in named(d.read_text()) if t not in have}
    assert not missing, sorted(missing)


def test_every_kpp_variable_the_docs_name_is_read_somewhere():
    code = "\n".join(p.read_text(errors="replace") for g in CODE_GLOBS for p in ROOT.glob(g) if p.is_file()
                     and "target" not in p.parts)
    missing = {f"{d.relative_to(ROOT)}: {v}" for d in DOCS for v in set(re.findall(r"\bKPP_[A-Z0-9_]+", d.read_text()))
               if v not in code}
    assert not missing, sorted(missing)


def test_the_check_catches_the_old_readme():
    old = "`e2e-k8s-if-cached` (what `make test` runs ...; `make test KPP_K8S_BUILD=1` builds them) `make e2e-k8s-if-cached`"
    assert "e2e-k8s-if-cached" in named(old) - targets()
