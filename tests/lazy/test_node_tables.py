"""lazy.node_tables: QuickScorer's leaf numbering, shared by the host kernel and the compiler."""

from __future__ import annotations

from lazy.node_tables import leaf_order

# 0: split → 1 (leaf), 2: split → 3 (leaf), 4: split → 5 (leaf), 6 (leaf)
TREE = {0: (1, 2), 2: (3, 4), 4: (5, 6)}


def test_leaves_left_to_right_and_each_split_rules_out_its_left_subtree() -> None:
    leaves, splits = leaf_order(0, TREE.get)
    assert leaves == [(1, (False,)), (3, (True, False)), (5, (True, True, False)), (6, (True,) * 3)]
    # (node, level, first leaf of the left subtree, first of the right): false at node 2 rules
    # out leaf 1 (node 3) only.
    assert splits == [(0, 0, 0, 1), (2, 1, 1, 2), (4, 2, 2, 3)]


def test_a_cut_makes_deeper_nodes_leaves_and_a_limit_gives_up() -> None:
    leaves, splits = leaf_order(0, TREE.get, cut=2)
    assert [node for node, _ in leaves] == [1, 3, 4] and len(splits) == 2
    assert leaf_order(0, TREE.get, limit=3) is None
    assert leaf_order(0, TREE.get, limit=4) is not None
