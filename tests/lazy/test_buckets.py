import math

import numpy as np
import pytest

from lazy.buckets import Buckets, pad_rows


@pytest.mark.parametrize("max_batch", [1, 2, 3, 8, 100, 1000, 1024, 4097])
def test_sizes_are_powers_of_two_then_max(max_batch: int) -> None:
    buckets = Buckets(max_batch)
    assert buckets.sizes[-1] == max_batch
    assert all(s == 1 << i for i, s in enumerate(buckets.sizes[:-1]))
    assert len(buckets) <= math.ceil(math.log2(max_batch)) + 1


@pytest.mark.parametrize("max_batch", [1, 7, 8, 100])
def test_index_picks_the_smallest_bucket_that_fits(max_batch: int) -> None:
    buckets = Buckets(max_batch)
    for rows in range(1, max_batch + 1):
        size = buckets.sizes[buckets.index(rows)]
        assert size >= rows
        assert all(s < rows for s in buckets.sizes if s < size)


def test_chunks_cover_rows_in_order() -> None:
    assert list(Buckets(4).chunks(10)) == [(0, 4), (4, 8), (8, 10)]
    assert list(Buckets(4).chunks(4)) == [(0, 4)]


def test_pad_rows_repeats_the_last_row() -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    padded = pad_rows(a, 5)
    np.testing.assert_array_equal(padded[:3], a)
    np.testing.assert_array_equal(padded[3:], [[4, 5], [4, 5]])
    assert pad_rows(a, 3) is a


def test_invalid_max_batch() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Buckets(0)


def test_large_buckets_double_up_to_call_rows() -> None:
    buckets = Buckets(4, call_rows=32)
    assert buckets.sizes == (1, 2, 4, 8, 16, 32)
    assert [buckets.sizes[buckets.index(r)] for r in (3, 4, 5, 8, 9, 17, 32)] == [
        4,
        4,
        8,
        8,
        16,
        32,
        32,
    ]


def test_chunks_take_the_largest_bucket_then_the_padded_rest() -> None:
    buckets = Buckets(4, call_rows=16)
    assert list(buckets.chunks(40)) == [(0, 16), (16, 32), (32, 40)]
    assert list(buckets.chunks(27)) == [(0, 16), (16, 24), (24, 27)]
    assert list(buckets.chunks(27, start=3)) == [(3, 19), (19, 27)]


@pytest.mark.parametrize("call_rows", [3, 12, 20])
def test_call_rows_must_be_max_batch_times_a_power_of_two(call_rows: int) -> None:
    with pytest.raises(ValueError, match="call_rows must be max_batch"):
        Buckets(4, call_rows=call_rows)
