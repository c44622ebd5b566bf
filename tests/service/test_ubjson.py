"""The bounded UBJSON decoder used to check XGBoost ``.ubj`` uploads."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from service.artifacts.ubjson import UBJSONError, decode


def _key(name: str) -> bytes:
    return b"U" + bytes([len(name)]) + name.encode()


def test_scalars_strings_and_containers() -> None:
    data = (
        b"{"
        + _key("i")
        + b"i\xff"
        + _key("U")
        + b"U\xff"
        + _key("I")
        + b"I\x01\x00"
        + _key("l")
        + b"l"
        + struct.pack(">i", -7)
        + _key("L")
        + b"L"
        + struct.pack(">q", 2**40)
        + _key("d")
        + b"d"
        + struct.pack(">f", 0.5)
        + _key("D")
        + b"D"
        + struct.pack(">d", 1.25)
        + _key("s")
        + b"SU\x03abc"
        + _key("flags")
        + b"[TFZN]"  # N is padding
        + _key("nested")
        + b"[{}[]]"
        + b"}"
    )
    assert decode(data) == {
        "i": -1,
        "U": 255,
        "I": 256,
        "l": -7,
        "L": 2**40,
        "d": 0.5,
        "D": 1.25,
        "s": "abc",
        "flags": [True, False, None],
        "nested": [{}, []],
    }


def test_typed_arrays_become_numpy_and_counted_containers_need_no_end() -> None:
    values = np.array([1, -2, 3], dtype=">i4")
    data = b"[$l#U\x03" + values.tobytes()
    decoded = decode(data)
    assert isinstance(decoded, np.ndarray)
    np.testing.assert_array_equal(decoded, [1, -2, 3])
    assert decode(b"[#U\x02SU\x01aSU\x01b") == ["a", "b"]
    assert decode(b"{$i#U\x02U\x01x\x05U\x01y\x06") == {"x": 5, "y": 6}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"[$l#U\x03\x00\x00", "declares 3 items but only 2 bytes are left"),
        (b"[$l#L" + struct.pack(">q", 2**60), "declares"),
        (b"[$T#L" + struct.pack(">q", 2**40), "declares"),
        (b"SU\x05ab", "truncated"),
        (b"[" * 100 + b"]" * 100, "nesting deeper than 64"),
        (b"i\x01i\x02", "trailing bytes"),
        (b"X", "unknown marker"),
        (b"[$iU\x01]", "typed container without a count"),
        (b"SU\x02\xff\xfe", "not UTF-8"),
        (b"SI\xff\xff", "negative length"),
        (b"[i\x01", "truncated"),
    ],
)
def test_malformed_input_is_refused_with_its_offset(data: bytes, match: str) -> None:
    with pytest.raises(UBJSONError, match=match) as info:
        decode(data)
    assert "at byte" in str(info.value)
