"""Object store shared by all instances of a cluster, standing in for etcd.

Objects are keyed by (group, resource, namespace, name) — storage is version-independent, so an object written
through one version (or one instance) is readable through any other. Every write takes the next value of one
global resourceVersion and is appended to a bounded event log that watches replay from; writers notify
`cond` so watches on every instance wake up.
"""

from __future__ import annotations  # the `list` method shadows the builtin in later annotations

import copy
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable

Key = tuple[str, str, str, str]  # (group, resource, namespace, name)


class NotFound(Exception):
    pass


class AlreadyExists(Exception):
    pass


class Conflict(Exception):
    """Raised by update callbacks when the caller's resourceVersion precondition fails."""


class Expired(Exception):
    """The requested resourceVersion is older than the oldest event kept (the apiserver's 410 Gone)."""


@dataclass(frozen=True)
class Event:
    """One store change. `prev` is the object before a MODIFIED, so selector watches can see transitions."""

    rv: int
    type: str  # ADDED, MODIFIED or DELETED
    key: Key
    obj: dict
    prev: dict | None = None


class Store:
    def __init__(self, max_events: int = 10_000):
        self.cond = threading.Condition()
        self._objects: dict[Key, dict] = {}
        self._events: deque[Event] = deque(maxlen=max_events)
        self._rv = 0
        self._compacted_rv = 0  # rv of the newest event dropped from the log

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, key: Key) -> dict:
        with self.cond:
            if key not in self._objects:
                raise NotFound(key)
            return copy.deepcopy(self._objects[key])

    def list(self, group: str, resource: str, namespace: str = "") -> tuple[int, list[dict]]:
        """(current resourceVersion, objects sorted by namespace and name); all namespaces when namespace is ""."""
        with self.cond:
            keys = sorted(k for k in self._objects if self._in_scope(k, group, resource, namespace))
            return self._rv, [copy.deepcopy(self._objects[k]) for k in keys]

    def create(self, key: Key, obj: dict) -> dict:
        with self.cond:
            if key in self._objects:
                raise AlreadyExists(key)
            return self._commit("ADDED", key, obj)

    def update(self, key: Key, change: Callable[[dict], dict]) -> dict:
        """Atomic read-modify-write: `change` gets a copy of the current object and returns the new one."""
        with self.cond:
            if key not in self._objects:
                raise NotFound(key)
            return self._commit("MODIFIED", key, change(copy.deepcopy(self._objects[key])))

    def delete(self, key: Key) -> dict:
        with self.cond:
            if key not in self._objects:
                raise NotFound(key)
            return self._commit("DELETED", key, self._objects[key])

    def delete_collection(self, group: str, resource: str, namespace: str, matches: Callable[[dict], bool]) -> None:
        with self.cond:
            for key in sorted(k for k in self._objects if self._in_scope(k, group, resource, namespace)):
                if matches(self._objects[key]):
                    self._commit("DELETED", key, self._objects[key])

    def events_after(self, rv: int) -> list[Event]:
        """Events newer than rv, oldest first. Call with `cond` held."""
        if rv < self._compacted_rv:
            raise Expired(f"too old resource version: {rv} ({self._compacted_rv})")
        newer = []
        for event in reversed(self._events):
            if event.rv <= rv:
                break
            newer.append(event)
        return newer[::-1]

    def _commit(self, type_: str, key: Key, obj: dict) -> dict:
        """Stamp the next resourceVersion, apply, log and wake watchers; returns a copy of the stored object."""
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        prev = self._objects.get(key)
        if type_ == "DELETED":
            del self._objects[key]
        else:
            self._objects[key] = obj
        if len(self._events) == self._events.maxlen:
            self._compacted_rv = self._events[0].rv
        self._events.append(Event(self._rv, type_, key, obj, prev if type_ == "MODIFIED" else None))
        self.cond.notify_all()
        return copy.deepcopy(obj)

    @staticmethod
    def _in_scope(key: Key, group: str, resource: str, namespace: str) -> bool:
        return key[0] == group and key[1] == resource and (not namespace or key[2] == namespace)
