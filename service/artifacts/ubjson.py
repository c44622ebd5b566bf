"""A bounded Universal Binary JSON (UBJSON) decoder, for checking XGBoost ``.ubj`` models.

XGBoost's own loader accepts structurally hostile models (child indices out of range) that crash
at predict time, so a ``.ubj`` upload is decoded here and checked like a JSON one before XGBoost
sees it. The decoder never allocates more than the input justifies: every declared count is
checked against the bytes left, nesting is bounded, and typed numeric arrays become numpy views
instead of Python lists.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

# marker → big-endian struct format; numpy reads typed arrays with the same layout.
_INTS = {b"i": ">b", b"U": ">B", b"I": ">h", b"l": ">i", b"L": ">q"}
_NUMBERS = {**_INTS, b"d": ">f", b"D": ">d"}
_CONSTANTS = {b"Z": None, b"T": True, b"F": False}


class UBJSONError(ValueError):
    """Malformed UBJSON; the message gives the byte offset."""


class _Reader:
    def __init__(self, data: bytes, max_depth: int) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.max_depth = max_depth

    def fail(self, problem: str) -> UBJSONError:
        return UBJSONError(f"{problem} at byte {self.pos}")

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"truncated: {n} bytes needed, {len(self.data) - self.pos} left")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def marker(self) -> bytes:
        marker = bytes(self.take(1))
        while marker == b"N":  # no-op padding
            marker = bytes(self.take(1))
        return marker

    def number(self, marker: bytes) -> int | float:
        fmt = _NUMBERS[marker]
        (value,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return value

    def length(self, marker: bytes | None = None) -> int:
        marker = marker or self.marker()
        if marker not in _INTS:
            raise self.fail(f"expected an integer length, got marker {marker!r}")
        value = int(self.number(marker))
        if value < 0:
            raise self.fail(f"negative length {value}")
        return value

    def text(self) -> str:
        raw = self.take(self.length())
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"string is not UTF-8 ({exc.reason})") from None

    def value(self, marker: bytes, depth: int) -> Any:
        if marker in _CONSTANTS:
            return _CONSTANTS[marker]
        if marker in _NUMBERS:
            return self.number(marker)
        if marker in (b"S", b"H"):  # H: a high-precision number, kept as its text
            return self.text()
        if marker == b"C":
            return chr(self.take(1)[0])
        if marker in (b"[", b"{"):
            if depth >= self.max_depth:
                raise self.fail(f"nesting deeper than {self.max_depth}")
            return self.array(depth + 1) if marker == b"[" else self.object(depth + 1)
        raise self.fail(f"unknown marker {marker!r}")

    def container_header(self) -> tuple[bytes | None, int | None]:
        """The optional ``$type`` and ``#count`` of an optimized container."""
        kind = count = None
        if bytes(self.data[self.pos : self.pos + 1]) == b"$":
            self.pos += 1
            kind = bytes(self.take(1))
            if bytes(self.data[self.pos : self.pos + 1]) != b"#":
                raise self.fail("typed container without a count")
        if bytes(self.data[self.pos : self.pos + 1]) == b"#":
            self.pos += 1
            count = self.length()
            # Every element takes at least one byte, except typed constants (no payload at all).
            per_item = struct.calcsize(_NUMBERS[kind]) if kind in _NUMBERS else 1
            left = len(self.data) - self.pos
            if count * per_item > left and kind not in _CONSTANTS:
                raise self.fail(f"container declares {count} items but only {left} bytes are left")
            if kind in _CONSTANTS and count > len(self.data):
                raise self.fail(f"container declares {count} items in a {len(self.data)}-byte file")
        return kind, count

    def array(self, depth: int) -> Any:
        kind, count = self.container_header()
        if kind in _NUMBERS and count is not None:
            dtype = np.dtype(_NUMBERS[kind])
            return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype)
        items = []
        if count is not None:
            for _ in range(count):
                items.append(self.value(kind or self.marker(), depth))
            return items
        while (marker := self.marker()) != b"]":
            items.append(self.value(marker, depth))
        return items

    def object(self, depth: int) -> dict[str, Any]:
        kind, count = self.container_header()
        items: dict[str, Any] = {}
        if count is not None:
            for _ in range(count):
                key = self.text()
                items[key] = self.value(kind or self.marker(), depth)
            return items
        while (marker := self.marker()) != b"}":
            raw = self.take(self.length(marker))
            try:
                key = str(raw, "utf-8")
            except UnicodeDecodeError as exc:
                raise self.fail(f"key is not UTF-8 ({exc.reason})") from None
            items[key] = self.value(self.marker(), depth)
        return items


def decode(data: bytes, *, max_depth: int = 64) -> Any:
    """Decode one UBJSON value that spans all of ``data``."""
    reader = _Reader(data, max_depth)
    value = reader.value(reader.marker(), 0)
    if reader.pos != len(data):
        raise reader.fail(f"{len(data) - reader.pos} trailing bytes after the value")
    return value
