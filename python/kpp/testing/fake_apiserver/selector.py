"""Equality-based label and field selectors (`k=v`, `k==v`, `k!=v`, `k`, `!k`), enough for kubectl and informers."""

import re
from typing import Callable

_KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")


def _terms(selector: str, allow_existence: bool) -> list[tuple[str, str, str]]:
    """(key, op, value) per comma-separated term; ValueError for anything set-based or malformed."""
    terms = []
    for raw in filter(None, (t.strip() for t in selector.split(","))):
        for op in ("!=", "==", "="):
            key, found, value = raw.partition(op)
            if found:
                term = (key.strip(), "!=" if op == "!=" else "=", value.strip())
                break
        else:
            if not allow_existence:
                raise ValueError(f"invalid selector: {raw!r}")
            term = (raw[1:].strip(), "!exists", "") if raw.startswith("!") else (raw, "exists", "")
        if not _KEY.match(term[0]):
            raise ValueError(f"unable to parse requirement: {raw!r}")
        terms.append(term)
    return terms


def _field(obj: dict, path: str) -> str:
    """String value of a dotted field path, "" when absent (how field selectors see missing fields)."""
    value = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def _holds(actual: str | None, op: str, value: str) -> bool:
    if op == "exists":
        return actual is not None
    if op == "!exists":
        return actual is None
    return (actual == value) == (op == "=")


def parse(label_selector: str = "", field_selector: str = "") -> Callable[[dict], bool]:
    """Predicate over objects for the raw `labelSelector`/`fieldSelector` query values."""
    labels = _terms(label_selector, allow_existence=True)
    fields = _terms(field_selector, allow_existence=False)

    def matches(obj: dict) -> bool:
        obj_labels = (obj.get("metadata") or {}).get("labels") or {}
        return (all(_holds(obj_labels.get(k), op, v) for k, op, v in labels)
                and all(_holds(_field(obj, k), op, v) for k, op, v in fields))

    return matches
