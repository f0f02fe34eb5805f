"""Reads a .wasm module's export section (stdlib only): which proxy-wasm callbacks Envoy will call."""

from __future__ import annotations

from pathlib import Path

MAGIC = b"\0asm\x01\0\0\0"
EXPORT_SECTION = 7
KINDS = {0: "func", 1: "table", 2: "memory", 3: "global", 4: "tag"}


def _leb(b: bytes, i: int) -> tuple[int, int]:
    r = shift = 0
    while True:
        x = b[i]
        i += 1
        r |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return r, i


def exports(path: Path | str) -> dict[str, str]:
    """Export name -> kind ("func", "memory", ...)."""
    b = Path(path).read_bytes()
    if b[:8] != MAGIC:
        raise ValueError(f"{path}: not a wasm module")
    out: dict[str, str] = {}
    i = 8
    while i < len(b):
        section = b[i]
        size, j = _leb(b, i + 1)
        if section == EXPORT_SECTION:
            n, k = _leb(b, j)
            for _ in range(n):
                length, k = _leb(b, k)
                name = b[k:k + length].decode()
                kind = b[k + length]
                _, k = _leb(b, k + length + 1)
                out[name] = KINDS.get(kind, str(kind))
        i = j + size
    return out
