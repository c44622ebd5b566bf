"""Version records: options stored by older releases still load."""

from __future__ import annotations

import pytest

from service.versions import REMOVED_TREE_STRATEGIES, ModelOptions


@pytest.mark.parametrize("strategy", sorted(REMOVED_TREE_STRATEGIES))
def test_a_stored_version_with_a_removed_tree_strategy_loads_with_auto(strategy: str) -> None:
    stored = {"max_batch": 64, "tree_strategy": strategy, "dtype": "float64", "methods": None}
    options = ModelOptions.stored(stored)
    assert options.tree_strategy == "auto"
    assert (options.max_batch, options.dtype) == (64, "float64")  # the rest is kept
    with pytest.raises(ValueError, match="tree_strategy"):  # a new upload is refused
        ModelOptions.model_validate(stored)
