"""The load balancers operators put in front of kubeadm control-plane nodes, run for real on loopback.

* HAProxy (Debian's package) with the configuration of kubeadm's high-availability guide
  (kubernetes/kubeadm docs/ha-considerations.md, "haproxy configuration"), copied as the guide gives it.
  Only its placeholders and addresses are filled in: the frontend's port and address (127.0.0.1, not
  `*`), one `server` line per node, and the syslog address (`/dev/log` becomes a socket this module
  reads). HAProxy's own defaults then apply: a check every 2 s, DOWN after 3 failures, UP after 2
  successes. The check is `GET /healthz` over TLS in HTTP/1.0 without a Host header.
* An Envoy TCP proxy with active HTTP health checks of `/healthz` (the same interval and thresholds),
  a common second checker; Envoy's health checker speaks HTTP/1.1 and honours
  `x-envoy-immediate-health-check-fail`.

Both report every change of a server's state with the time it was seen (time.monotonic()).
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import string
import subprocess
import threading
import time
from pathlib import Path

from kpp.testing import proc
from kpp.testing.proc import get_json


# kubeadm's HA guide, "haproxy configuration" (kubernetes/kubeadm docs/ha-considerations.md), verbatim.
KUBEADM_GUIDE_HAPROXY_CFG = """\
# /etc/haproxy/haproxy.cfg
#---------------------------------------------------------------------
# Global settings
#---------------------------------------------------------------------
global
    log /dev/log local0
    log /dev/log local1 notice
    daemon

#---------------------------------------------------------------------
# common defaults that all the 'listen' and 'backend' sections will
# use if not designated in their block
#---------------------------------------------------------------------
defaults
    mode                    http
    log                     global
    option                  httplog
    option                  dontlognull
    option http-server-close
    option forwardfor       except 127.0.0.0/8
    option                  redispatch
    retries                 1
    timeout http-request    10s
    timeout queue           20s
    timeout connect         5s
    timeout client          35s
    timeout server          35s
    timeout http-keep-alive 10s
    timeout check           10s

#---------------------------------------------------------------------
# apiserver frontend which proxys to the control plane nodes
#---------------------------------------------------------------------
frontend apiserver
    bind *:${APISERVER_DEST_PORT}
    mode tcp
    option tcplog
    default_backend apiserverbackend

#---------------------------------------------------------------------
# round robin balancing for apiserver
#---------------------------------------------------------------------
backend apiserverbackend
    option httpchk

    http-check connect ssl
    http-check send meth GET uri /healthz
    http-check expect status 200

    mode tcp
    balance     roundrobin
    
    server ${HOST1_ID} ${HOST1_ADDRESS}:${APISERVER_SRC_PORT} check verify none
        # [...]
"""
HOST_LINE = "    server ${HOST1_ID} ${HOST1_ADDRESS}:${APISERVER_SRC_PORT} check verify none\n"
# HAProxy's defaults for what the guide leaves out (`inter`, `fall`, `rise`).
CHECK_INTERVAL, FALL, RISE = 2.0, 3, 2


def haproxy_binary() -> str:
    """Debian's haproxy (scripts/setup.sh installs it); /usr/sbin may be missing from a user's PATH."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise RuntimeError("haproxy is missing: run scripts/setup.sh (apt-get install haproxy)")
    return found


def haproxy_config(listen: tuple[str, int], servers: list[tuple[str, str, int]], log_socket: Path) -> str:
    """The guide's text with its placeholders filled in: listen (address, port) of the frontend,
    servers [(id, address, port)] (one `server` line each; the guide's line for HOST1 repeated, as
    its text says), and the syslog socket in place of /dev/log."""
    ports = {p for _, _, p in servers}
    if len(ports) != 1:
        raise ValueError("the guide has one ${APISERVER_SRC_PORT} for every node")
    cfg = KUBEADM_GUIDE_HAPROXY_CFG
    if cfg.count(HOST_LINE) != 1 or cfg.count("bind *:") != 1 or cfg.count("/dev/log") != 2:
        raise ValueError("the guide's text changed")
    lines = "".join(HOST_LINE.replace("HOST1_", f"HOST{i}_") for i in range(1, len(servers) + 1))
    cfg = cfg.replace(HOST_LINE, lines).replace("bind *:", f"bind {listen[0]}:").replace("/dev/log", str(log_socket))
    values = {"APISERVER_DEST_PORT": str(listen[1]), "APISERVER_SRC_PORT": str(ports.pop())}
    for i, (sid, address, _) in enumerate(servers, 1):
        values[f"HOST{i}_ID"], values[f"HOST{i}_ADDRESS"] = sid, address
    return string.Template(cfg).substitute(values)


class StateLog:
    """Server state changes [(t, server, "UP"|"DOWN", text)] and check results, appended by a thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[tuple[float, str, str, str]] = []
        self.lines: list[tuple[float, str]] = []

    def add_line(self, t: float, line: str):
        with self.lock:
            self.lines.append((t, line))

    def add(self, t: float, server: str, state: str, text: str = ""):
        with self.lock:
            self.events.append((t, server, state, text))

    def transitions(self, server: str | None = None) -> list[tuple[float, str, str, str]]:
        with self.lock:
            return [e for e in self.events if server is None or e[1] == server]

    def down_between(self, server: str, t0: float, t1: float) -> list[tuple[float, str, str, str]]:
        return [e for e in self.transitions(server) if e[2] == "DOWN" and t0 <= e[0] <= t1]

    def first(self, server: str, state: str, after: float) -> float | None:
        return next((e[0] for e in self.transitions(server) if e[2] == state and e[0] >= after), None)


# "Server apiserverbackend/n1 is DOWN, reason: Layer7 wrong status, code: 503, ..." (also "is going DOWN"
# for maintenance, and "is UP").
_HAPROXY_STATE = re.compile(r"Server (\S+)/(\S+) is (UP|DOWN)\b(.*)")


class HAProxy:
    """Debian's haproxy in the foreground (-db) with the guide's configuration."""

    def __init__(self, workdir: Path, listen: tuple[str, int], servers: list[tuple[str, str, int]]):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.listen = listen
        self.log_socket = self.workdir / "log.sock"
        self.config = haproxy_config(listen, servers, self.log_socket)
        self.config_path = self.workdir / "haproxy.cfg"
        self.state = StateLog()
        self.process: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, timeout: float = 10.0) -> "HAProxy":
        self.config_path.write_text(self.config)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.log_socket))
        self._sock.settimeout(0.2)
        check = subprocess.run([haproxy_binary(), "-c", "-f", str(self.config_path)], capture_output=True, text=True,
                               timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused the guide's configuration:\n{check.stdout}{check.stderr}")
        self.stderr_path = self.workdir / "haproxy.stderr"
        self.process = subprocess.Popen([haproxy_binary(), "-db", "-f", str(self.config_path)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True, preexec_fn=proc.die_with_parent(signal.SIGTERM))
        for target in (self._read_syslog, self._read_stderr):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(self.listen, timeout=0.5).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"haproxy did not listen on {self.listen}:\n{self.log_text()}")
                time.sleep(0.05)

    def _note(self, line: str):
        t = time.monotonic()
        self.state.add_line(t, line)
        m = _HAPROXY_STATE.search(line)
        if m and m.group(1) == "apiserverbackend":
            self.state.add(t, m.group(2), m.group(3), m.group(4).strip())

    def _read_syslog(self):
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            self._note(data.decode(errors="replace").strip())

    def _read_stderr(self):
        with open(self.stderr_path, "w") as out:
            for line in self.process.stderr:
                out.write(line)
                out.flush()
                # State changes come through syslog too; stderr only for the log text.
                self.state.add_line(time.monotonic(), "stderr: " + line.rstrip())

    def log_text(self) -> str:
        with self.state.lock:
            return "\n".join(line for _, line in self.state.lines[-300:])

    def stop(self):
        self._stop.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill_and_reap(self.process)
        if self._sock is not None:
            self._sock.close()


def render_envoy_tcp_lb(listen: tuple[str, int], admin_port: int, servers: list[tuple[str, str, int]],
                        ca: Path, sni: str = "kubernetes.default.svc") -> str:
    """An Envoy TCP proxy over the nodes with active HTTP health checks of /healthz (TLS, the nodes'
    serving certificate verified against `ca`), interval and thresholds as HAProxy's defaults."""
    cluster = {
        "name": "apiservers", "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
        "load_assignment": {"cluster_name": "apiservers", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": a, "port_value": p}}}}
            for _, a, p in servers]}]},
        "health_checks": [{
            "timeout": "1s", "interval": f"{CHECK_INTERVAL:g}s", "no_traffic_interval": f"{CHECK_INTERVAL:g}s",
            "unhealthy_threshold": FALL, "healthy_threshold": RISE,
            "http_health_check": {"path": "/healthz"},
            "transport_socket_match_criteria": {"health_check": "tls"}}],
        # Traffic passes through as TCP (the client's TLS goes to the node); only the checks speak TLS.
        "transport_socket_matches": [{"name": "health-check-tls", "match": {"health_check": "tls"},
                                      "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": sni,
            "common_tls_context": {"validation_context": {"trusted_ca": {"filename": str(ca)}}}}}}],
    }
    return json.dumps({
        "node": {"id": "kpp-envoy-lb", "cluster": "kpp-envoy-lb"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{"name": "lb", "address": {"socket_address": {"address": listen[0],
                                                                          "port_value": listen[1]}},
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                               "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                               "stat_prefix": "lb", "cluster": "apiservers"}}]}]}],
            "clusters": [cluster]}}, indent=2) + "\n"


class EnvoyLBWatcher:
    """Polls the Envoy LB's admin /clusters and records each host's health changes (DOWN = an active
    health check failure flag)."""

    def __init__(self, admin_port: int, names: dict[str, str], interval: float = 0.05):
        self.url = f"http://127.0.0.1:{admin_port}/clusters?format=json"
        self.names = names  # "address:port" -> server id
        self.interval = interval
        self.state = StateLog()
        self._last: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> dict[str, str]:
        doc = get_json(self.url)
        out = {}
        for c in doc.get("cluster_statuses", []):
            if c.get("name") != "apiservers":
                continue
            for h in c.get("host_statuses", []):
                sa = h["address"]["socket_address"]
                flags = h.get("health_status", {})
                failed = flags.get("failed_active_health_check", False) or flags.get("eds_health_status") == "UNHEALTHY"
                out[self.names.get(f"{sa['address']}:{sa['port_value']}", sa["address"])] = "DOWN" if failed else "UP"
        return out

    def _run(self):
        while not self._stop.is_set():
            try:
                now = self.poll()
            except OSError:
                now = {}
            t = time.monotonic()
            for server, state in now.items():
                if self._last.get(server, "UP") != state:
                    self.state.add(t, server, state)
                self._last[server] = state
            self._stop.wait(self.interval)

    def start(self) -> "EnvoyLBWatcher":
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(5)
