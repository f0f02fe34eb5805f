"""`make run` works: the demo's own check (`scripts/demo.py --check`) starts the three fake apiservers
and Envoys on the demo's fixed ports, runs every command it prints, and stops them."""

from __future__ import annotations

import subprocess
import sys

from kpp.testing import harness


def test_demo_check_passes():
    r = subprocess.run([sys.executable, str(harness.ROOT / "scripts" / "demo.py"), "--check"], cwd=harness.ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "0 failed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
