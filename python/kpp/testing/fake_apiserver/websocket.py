"""A minimal RFC 6455 WebSocket client (stdlib only) for tests of the fake's exec-style echo subresources.

    ws = WebSocket.connect("127.0.0.1", port, "/api/v1/namespaces/ns1/pods/p1/exec", ["v5.channel.k8s.io"])
    ws.status, ws.headers          # 101 and the handshake response headers (or the error answer)
    ws.recv()                      # (opcode, payload): the greeting "<instance> exec p1"
    ws.send(b"hello"); ws.recv()   # (0x2, b"hello")
    ws.close()
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA


class WebSocket:
    def __init__(self, sock: socket.socket, status: int, headers: dict[str, str], rest: bytes):
        self.sock, self.status, self.headers = sock, status, headers
        self._buffer = rest

    @classmethod
    def connect(cls, host: str, port: int, path: str, protocols: list[str] | None = None,
                headers: dict[str, str] | None = None, timeout: float = 10.0) -> "WebSocket":
        """Opens the connection and performs the handshake; check `status` (101 on success)."""
        sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        if protocols:
            lines.append("Sec-WebSocket-Protocol: " + ", ".join(protocols))
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"connection closed during the handshake: {data!r}")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        parsed = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            parsed[name.strip().lower()] = value.strip()
        ws = cls(sock, status, parsed, rest)
        if status == 101:
            expected = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
            if parsed.get("sec-websocket-accept") != expected:
                raise ConnectionError(f"bad Sec-WebSocket-Accept {parsed.get('sec-websocket-accept')!r}")
        return ws

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ConnectionError("connection closed")
            self._buffer += chunk
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def send(self, payload: bytes | str, opcode: int | None = None):
        """One masked frame (text for str, binary for bytes unless opcode says otherwise)."""
        if isinstance(payload, str):
            payload, opcode = payload.encode(), opcode or TEXT
        opcode = opcode or BINARY
        length = len(payload)
        if length < 126:
            head = bytes([0x80 | opcode, 0x80 | length])
        elif length < 1 << 16:
            head = bytes([0x80 | opcode, 0x80 | 126]) + length.to_bytes(2, "big")
        else:
            head = bytes([0x80 | opcode, 0x80 | 127]) + length.to_bytes(8, "big")
        mask = os.urandom(4)
        # XOR with a repeated mask, fast for large payloads: int arithmetic on the whole buffer.
        repeated = (mask * (length // 4 + 1))[:length]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(length, "big")
        self.sock.sendall(head + mask + masked)

    def recv(self) -> tuple[int, bytes]:
        """Next server frame as (opcode, payload); servers do not mask, and the fake never fragments."""
        b0, b1 = self._read(2)
        length = b1 & 0x7F
        if length == 126:
            length = int.from_bytes(self._read(2), "big")
        elif length == 127:
            length = int.from_bytes(self._read(8), "big")
        return b0 & 0x0F, self._read(length)

    def close(self, code: int = 1000):
        try:
            self.send(code.to_bytes(2, "big"), CLOSE)
            while self.recv()[0] != CLOSE:
                pass
        except OSError:
            pass
        finally:
            self.sock.close()
