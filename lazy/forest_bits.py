"""FOREST_SUM for batches on the host: bit-vectors for the top of every tree, a compacted walk
below.

The walk (:func:`lazy.forest.native`) follows one path per (row, tree): a few loads and a
branch per level, and the branch goes either way, so the CPU mispredicts about half of them.
For a batch, two things cost less:

- The top levels of a tree by bit-vectors (QuickScorer, as the compiler's ``bitvector``
  strategy, :mod:`compiler.trees.quickscorer`): number the leaves left to right; a split whose
  test sends the row right rules out its left subtree's leaves; the exit leaf is the lowest
  leaf nothing rules out, the lowest set bit of the AND of the false splits' masks. A split's
  test is a compare, a select and an AND over a block's contiguous rows, which vector units run
  8-16 rows at a time, with no branch at all. Trees of up to 64 leaves are all top (two 32-bit
  mask words; a split's left subtree is one entry per word it covers); larger ones are cut after
  :data:`TOP_LEVELS` levels (one word), and the "leaves" there are the nodes at the cut.
- Below the cut, the block's rows walk the tree together, branch-free (a leaf loops to itself:
  threshold +inf), :data:`STEPS` levels at a time; then the rows that reached a leaf are
  dropped from the list (one pass, no branch), so a row takes about its own depth in steps, not
  the tree's. Indices are unsigned: numba then emits no negative-index fix-up per load, which
  alone sped the walk up markedly.

Tables are derived from FOREST_SUM's own node tables, so the op's meaning is untouched: a node
reached after ``depth`` steps counts as a leaf (where the walk stops), the NaN direction picks
which copy of a feature a split compares (the row as is, NaN as +inf, or isnan as 0/1 — as
:mod:`compiler.trees.splits` widens features), and trees are summed in the walk's order, so
the result is bit-identical.

On batches this beats the walk, the source libraries' own predict and XLA's tree-major walk
(docs/design-figures.md).
"""

from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import native as _native
from .node_tables import ALL_ONES, TOP_LEVELS, WORD_BITS, check_tables, leaf_order

#: Trees of up to this many mask words are evaluated whole by bit-vectors; larger ones are cut
#: after TOP_LEVELS levels.
MAX_WORDS = 2
#: Walk steps between two compactions of the rows still walking (3-4 measured best).
STEPS = 3
#: Entries of a (tree, word) group are evaluated four at a time: one pass over the block's mask
#: words per four splits (unrolled in the kernel; groups are padded with entries that keep all).
UNROLL = 4
#: Rows per block: the block's feature columns and mask words stay in L1/L2 while every tree
#: reads them (256-1024 measured alike; 256 keeps the walk's rows in L1).
BLOCK_ROWS = 256
#: Copies of a feature a split may compare (see the module docstring).
RAW, NAN_AS_INF, ISNAN = 0, 1, 2
#: Derived node tables larger than this many times the given ones are refused (tables that
#: share subtrees or loop would unroll into more; the walk then runs them as they are).
MAX_GROWTH = 4


@dataclass(frozen=True)
class BatchTables:
    """A forest as bit-vector entries for the top of each tree and node tables below.

    Block column ``c`` is copy ``sources[c, 1]`` of feature ``sources[c, 0]``. Entry ``e`` of
    tree ``t``'s word-``w`` group (``starts[t * words + w]`` to ``starts[t * words + w + 1]``)
    compares block column ``column[e]`` with ``threshold[e]`` and, where greater, ANDs
    ``mask[e]`` into word ``w``. The lowest set bit is the tree's slot ``j``: global slot
    ``t * words * 32 + j``, node ``slot_node`` of the walk's tables, whose leaves (``left`` is
    the node itself, ``node_threshold`` +inf) hold ``value[:, node]``. A tree with nothing
    below its top (``deep[t]`` 0) adds ``slot_value[:, slot]`` directly. Tree ``t`` adds to the
    outputs ``outputs[output_starts[t]:output_starts[t + 1]]`` only, those some leaf of it is
    non-zero in (boosting: one class per tree; adding +-0 changes no sum that starts at +0)."""

    sources: np.ndarray  # (C, 2) int64
    column: np.ndarray  # (E,) int64
    threshold: np.ndarray  # (E,) the features' dtype
    mask: np.ndarray  # (E,) uint32
    starts: np.ndarray  # (T * words + 1,) int64
    words: int
    slot_node: np.ndarray  # (T * words * 32,) uint32
    slot_value: np.ndarray  # (K, T * words * 32) the values' dtype
    deep: np.ndarray  # (T,) uint8
    output_starts: np.ndarray  # (T + 1,) int64
    outputs: np.ndarray  # (output_starts[-1],) int64
    node_column: np.ndarray  # (N,) uint32, a block column
    node_threshold: np.ndarray  # (N,) the features' dtype
    left: np.ndarray  # (N,) uint32
    value: np.ndarray  # (K, N) the values' dtype


def _renumber(
    roots: range, left: np.ndarray, depth: int, limit: int
) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, int, int], int]] | None:
    """Tree by tree, breadth first, children adjacent, nodes at ``depth`` levels made leaves:
    the source node of each new node, the new left child (itself at a leaf), and the new id of
    each (tree, source node, level); None past ``limit`` nodes."""
    source: list[int] = []
    new_left: list[int] = []
    new_id: dict[tuple[int, int, int], int] = {}
    for t in roots:
        level, d = [t], 0
        while level:
            following = []
            first_child = len(source) + len(level)
            for node in level:
                new_id.setdefault((t, node, d), len(source))
                source.append(node)
                if left[node] == node or d == depth:
                    new_left.append(len(source) - 1)
                else:
                    new_left.append(first_child + len(following))
                    following += [int(left[node]), int(left[node]) + 1]
            if len(source) + len(following) > limit:
                return None
            level, d = following, d + 1
    return np.array(source, np.int64), np.array(new_left, np.int64), new_id


def build(
    x_width: int,
    feature: np.ndarray,
    threshold: np.ndarray,
    nan_right: np.ndarray,
    left: np.ndarray,
    value: np.ndarray,
    *,
    trees: int,
    depth: int,
) -> BatchTables | None:
    """The batch tables of FOREST_SUM's node tables, or None where the walk should run them as
    they are (tables it rejects — it raises the error itself — or that unroll too far)."""
    try:
        check_tables(np.empty((0, x_width)), feature, left, trees)
    except IndexError:
        return None
    renumbered = _renumber(range(trees), left, depth, MAX_GROWTH * len(left) + trees)
    if renumbered is None:
        return None
    source, new_left, new_id = renumbered

    def children(node: int) -> tuple[int, int] | None:
        following = int(left[node])
        return None if following == node else (following, following + 1)

    tops = [leaf_order(t, children, depth, MAX_WORDS * WORD_BITS) for t in range(trees)]
    if any(top is None for top in tops):  # some tree is larger: cut every top at TOP_LEVELS
        cut = min(depth, TOP_LEVELS)
        tops = [leaf_order(t, children, cut, WORD_BITS) for t in range(trees)]
    walks = [top for top in tops if top is not None]  # all of them: a cut top has <= 32 leaves
    words = max(1, -(-max(len(leaves) for leaves, _ in walks) // WORD_BITS))
    slots = words * WORD_BITS
    # Every split's comparison, once, in the renumbered tables; the top's entries read them.
    sources, node_column, node_threshold = _compares(
        source, new_left, feature, threshold, nan_right
    )
    column: list[int] = []
    cut_at: list[float] = []
    mask: list[int] = []
    starts = [0]
    slot_node = np.zeros(trees * slots, np.int64)
    deep = np.zeros(trees, np.uint8)
    for t, (leaves, splits) in enumerate(walks):
        ids = [new_id[(t, node, len(turns))] for node, turns in leaves]
        slot_node[t * slots : t * slots + len(ids)] = ids
        slot_node[t * slots + len(ids) : (t + 1) * slots] = ids[0]  # never reached
        deep[t] = any(new_left[i] != i for i in ids)
        by_word: list[list[tuple[int, float, int]]] = [[] for _ in range(words)]
        for node, level, lo, mid in splits:
            i = new_id[(t, node, level)]
            c, th = int(node_column[i]), float(node_threshold[i])
            for w in range(lo // WORD_BITS, (mid - 1) // WORD_BITS + 1):
                first, last = max(lo, w * WORD_BITS), min(mid, (w + 1) * WORD_BITS)
                cleared = ((1 << (last - first)) - 1) << (first - w * WORD_BITS)
                by_word[w].append((c, th, ALL_ONES & ~cleared))
        for entries in by_word:
            entries += [(0, 0.0, ALL_ONES)] * (-len(entries) % UNROLL)
            for c, th, m in entries:
                column.append(c)
                cut_at.append(th)
                mask.append(m)
            starts.append(len(column))
    values = np.ascontiguousarray(value[source].T)
    # Per tree, the outputs some node of it holds a non-zero value in (its nodes are a range).
    firsts = [new_id[(t, t, 0)] for t in range(trees)] + [len(source)]
    outputs = [
        np.flatnonzero(np.any(values[:, firsts[t] : firsts[t + 1]] != 0, axis=1))
        for t in range(trees)
    ]
    return BatchTables(
        sources=sources,
        column=np.array(column, np.int64),
        threshold=np.array(cut_at, threshold.dtype),
        mask=np.array(mask, np.uint32),
        starts=np.array(starts, np.int64),
        words=words,
        slot_node=slot_node.astype(np.uint32),
        slot_value=np.ascontiguousarray(values[:, slot_node]),
        deep=deep,
        output_starts=np.concatenate([[0], np.cumsum([len(o) for o in outputs])]).astype(np.int64),
        outputs=np.concatenate([np.zeros(0, np.int64), *outputs]).astype(np.int64),
        node_column=node_column.astype(np.uint32),
        node_threshold=node_threshold.astype(threshold.dtype),
        left=new_left.astype(np.uint32),
        value=values,
    )


def _compares(
    source: np.ndarray,
    new_left: np.ndarray,
    feature: np.ndarray,
    threshold: np.ndarray,
    nan_right: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The block columns the splits of the renumbered tables read, as (feature, copy) rows,
    and per node the column and threshold such that ``column > threshold`` is the walk's "go
    right": a NaN-left split compares the row as is (NaN > t is false), a NaN-right one NaN as
    +inf, or, where t is +inf or NaN (nothing but NaN goes right), isnan as 0/1 against 0.5.
    Leaves compare column 0 with +inf: nothing goes right of them. Vectorized: a deep forest
    has 10^5-10^6 nodes."""
    inner = new_left != np.arange(len(source))
    t = np.asarray(threshold, np.float64)[source]
    right = np.asarray(nan_right, bool)[source]
    copy = np.where(~right, RAW, np.where(t < np.inf, NAN_AS_INF, ISNAN))
    codes = np.asarray(feature, np.int64)[source] * 3 + copy
    used, column = np.unique(codes[inner], return_inverse=True)
    node_column = np.zeros(len(source), np.int64)
    node_column[inner] = column
    cut = np.where(inner, np.where(copy == ISNAN, 0.5, t), np.inf)
    return np.stack([used // 3, used % 3], axis=1), node_column, cut


def evaluate(x: np.ndarray, tables: BatchTables) -> np.ndarray:
    """FOREST_SUM of ``x`` (B, F) by ``tables``: (B, K) in the leaf values' dtype."""
    out = np.empty((x.shape[0], tables.value.shape[0]), tables.value.dtype)
    _kernel()(
        x,
        tables.sources,
        tables.column,
        tables.threshold,
        tables.mask,
        tables.starts,
        tables.words,
        tables.slot_node,
        tables.slot_value,
        tables.deep,
        tables.output_starts,
        tables.outputs,
        tables.node_column,
        tables.node_threshold,
        tables.left,
        tables.value,
        BLOCK_ROWS,
        STEPS,
        out,
    )
    return out


class Cached:
    """Batch tables of the forests in use, built once per forest: every bucket's plan runs its
    own kernel, and compiling a plan runs it on copies of the parameters. Found by the arrays'
    identity (a dict look-up per call), else by their content (one hash per new set of arrays).
    An identity entry goes when its arrays do, and tables go with the last entry holding them,
    except the :data:`RECENT` last built: a plan's compile-time copies die before the plan's
    first call with the real parameters, which would otherwise build the same tables again."""

    #: Tables kept alive after their last holder, most recently built first.
    RECENT = 2

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: deque[BatchTables] = deque(maxlen=self.RECENT)
        self._by_identity: dict[tuple[int, ...], _Entry] = {}
        self._by_content: weakref.WeakValueDictionary[bytes, BatchTables] = (
            weakref.WeakValueDictionary()
        )
        self._refused: set[bytes] = set()  # forests the walk runs as they are

    def tables(self, operands: Sequence[np.ndarray], trees: int, depth: int) -> BatchTables | None:
        """The batch tables of FOREST_SUM's operands (None: the walk should run them)."""
        x, *node_tables = operands
        key = (trees, depth, *map(id, node_tables))
        entry = self._by_identity.get(key)  # a dict read: atomic
        if entry is not None and entry.holds(node_tables):
            return entry.tables
        digest = _digest(node_tables, trees, depth)
        with self._lock:
            built = self._by_content.get(digest)
            refused = digest in self._refused
        if built is None and not refused:
            feature, threshold, nan_right, left, value = node_tables
            built = build(
                x.shape[1], feature, threshold, nan_right, left, value, trees=trees, depth=depth
            )
        with self._lock:
            if built is None:
                self._refused.add(digest)
            else:
                built = self._by_content.setdefault(digest, built)
                self._recent.append(built)
            self._by_identity[key] = _Entry(tuple(weakref.ref(a) for a in node_tables), built)
        # When the node tables' left-child array goes, so does the entry (and its tables, unless
        # another entry holds them).
        weakref.finalize(node_tables[3], self._forget, key)
        return built

    def _forget(self, key: tuple[int, ...]) -> None:
        with self._lock:
            self._by_identity.pop(key, None)

    def __len__(self) -> int:
        """Identity entries held (for tests)."""
        return len(self._by_identity)


@dataclass(frozen=True)
class _Entry:
    refs: tuple[weakref.ref[np.ndarray], ...]
    tables: BatchTables | None

    def holds(self, arrays: Sequence[np.ndarray]) -> bool:
        return all(ref() is a for ref, a in zip(self.refs, arrays, strict=True))


def _digest(arrays: Sequence[np.ndarray], trees: int, depth: int) -> bytes:
    h = hashlib.blake2b(f"{trees}/{depth}".encode(), digest_size=16)
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).data)
    return h.digest()


#: The process's batch tables.
CACHE = Cached()


@functools.cache
def _kernel() -> Callable[..., None]:
    def evaluate(  # type: ignore[no-untyped-def]
        x,
        sources,
        column,
        threshold,
        mask,
        starts,
        words,
        slot_node,
        slot_value,
        deep,
        output_starts,
        outputs,
        node_column,
        node_threshold,
        left,
        value,
        block,
        steps,
        out,
    ):
        n = x.shape[0]
        n_columns, width = sources.shape[0], value.shape[0]
        trees = (starts.shape[0] - 1) // words
        one, all_ones = np.uint32(1), np.uint32(ALL_ONES)
        stride = np.uint32(block)
        xt = np.empty((max(n_columns, 1), block), x.dtype)
        flat = xt.reshape(-1)  # the walk reads xt[column, row] at column * block + row
        reach = np.empty((words, block), np.uint32)
        low = np.empty(block, np.float32)  # the lowest set bit, whose exponent is its index
        exponent = low.view(np.int32)
        slot = np.empty(block, np.uint32)
        node = np.empty(block, np.uint32)  # the walking rows' nodes, and which rows they are
        row = np.empty(block, np.uint32)
        final = np.empty(block, np.uint32)
        acc = np.empty((width, block), out.dtype)
        for s0 in range(0, n, block):
            m = min(block, n - s0)
            for c in range(n_columns):  # the block's columns, each copy the splits compare
                f, copy, col = sources[c, 0], sources[c, 1], xt[c]
                if copy == 0:
                    for r in range(m):
                        col[r] = x[s0 + r, f]
                elif copy == 1:
                    for r in range(m):
                        v = x[s0 + r, f]
                        col[r] = np.inf if v != v else v
                else:
                    for r in range(m):
                        v = x[s0 + r, f]
                        col[r] = 1.0 if v != v else 0.0
            acc[:, :m] = 0
            for t in range(trees):
                for w in range(words):
                    word = reach[w]
                    word[:m] = all_ones
                    g = t * words + w
                    for e in range(starts[g], starts[g + 1], 4):
                        c0, c1, c2, c3 = (
                            xt[column[e]],
                            xt[column[e + 1]],
                            xt[column[e + 2]],
                            xt[column[e + 3]],
                        )
                        t0, t1, t2, t3 = (
                            threshold[e],
                            threshold[e + 1],
                            threshold[e + 2],
                            threshold[e + 3],
                        )
                        m0, m1, m2, m3 = mask[e], mask[e + 1], mask[e + 2], mask[e + 3]
                        for r in range(m):
                            # a split that sends the row right ANDs its mask; else all ones
                            word[r] &= (
                                (m0 | (np.uint32(c0[r] > t0) - one))
                                & (m1 | (np.uint32(c1[r] > t1) - one))
                                & (m2 | (np.uint32(c2[r] > t2) - one))
                                & (m3 | (np.uint32(c3[r] > t3) - one))
                            )
                first, last = reach[0], reach[words - 1]
                for r in range(m):
                    w0 = first[r]
                    bits = w0 if w0 != 0 else last[r]
                    bits |= np.uint32(bits == 0)  # never 0 (the exit leaf's bit); bounds regardless
                    low[r] = np.float32(bits & (np.uint32(0) - bits))
                base = np.uint32(t * words * 32 - 127)  # 127: float32's exponent bias
                for r in range(m):
                    slot[r] = (
                        base
                        + np.uint32(exponent[r] >> 23)
                        + (first[r] == 0) * np.uint32(32 * (words - 1))
                    )
                if deep[t] == 0:  # the slots are the leaves
                    for j in range(output_starts[t], output_starts[t + 1]):
                        k = outputs[j]
                        values, into = slot_value[k], acc[k]
                        for r in range(m):
                            into[r] += values[slot[r]]
                    continue
                # Below the top: walk the rows not yet at a leaf, `steps` levels between drops.
                walking = 0
                for r in range(m):
                    at = slot_node[slot[r]]
                    final[r] = at
                    node[walking] = at
                    row[walking] = np.uint32(r)
                    walking += left[at] != at
                while walking > 0:
                    for _ in range(steps):
                        for i in range(walking):
                            at = node[i]
                            v = flat[node_column[at] * stride + row[i]]
                            node[i] = left[at] + np.uint32(v > node_threshold[at])
                    kept = 0
                    for i in range(walking):
                        at, r = node[i], row[i]
                        final[r] = at
                        node[kept] = at
                        row[kept] = r
                        kept += left[at] != at
                    walking = kept
                for j in range(output_starts[t], output_starts[t + 1]):
                    k = outputs[j]
                    values, into = value[k], acc[k]
                    for r in range(m):
                        into[r] += values[final[r]]
            for k in range(width):
                for r in range(m):
                    out[s0 + r, k] = acc[k, r]

    return _native.compile_kernel(evaluate)
