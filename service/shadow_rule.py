"""A shadow's optional rule: promote the shadow version once it has agreed with the serving one
on enough mirrored rows, or stop mirroring to it as soon as it can no longer pass.

Each replica decides on the rows it has compared itself (no replica waits for another); the
decision is one change of the store's manifest, made only if the shadow is still set as the rule
saw it, so two replicas deciding at once change it once. Agreement means: at most
``max_label_disagreement`` of the rows with another label (a classifier's), and, where
``max_abs_diff`` is set, no mirrored request with a numeric output further apart than it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # the store imports this module; service.shadow imports the store
    from service.shadow import Divergence


class InvalidRule(ValueError):
    """A rule's field is not what it must be (the message names it)."""


@dataclass(frozen=True)
class ShadowRule:
    #: Rows compared on one replica before the shadow is promoted.
    after_rows: int
    #: The share of rows whose label may differ, at most (0: none).
    max_label_disagreement: float = 0.0
    #: The largest |Δ| of a numeric output allowed (None: not checked).
    max_abs_diff: float | None = None

    def __post_init__(self) -> None:
        rows = self.after_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise InvalidRule(f"field 'after_rows' must be a whole number >= 1, got {rows!r}")
        ratio = self.max_label_disagreement
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
            raise InvalidRule(
                f"field 'max_label_disagreement' must be a number in [0, 1], got {ratio!r}"
            )
        gap = self.max_abs_diff
        if gap is not None and (
            isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 <= gap < math.inf
        ):
            raise InvalidRule(f"field 'max_abs_diff' must be a number >= 0, got {gap!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "after_rows": self.after_rows,
            "max_label_disagreement": self.max_label_disagreement,
            "max_abs_diff": self.max_abs_diff,
        }

    @classmethod
    def from_json(cls, data: object) -> ShadowRule:
        """The rule a JSON object describes; :class:`InvalidRule` naming what is wrong."""
        if not isinstance(data, Mapping):
            raise InvalidRule(f"field 'rule' must be a JSON object, got {data!r}")
        unknown = sorted(set(data) - {"after_rows", "max_label_disagreement", "max_abs_diff"})
        if unknown:
            raise InvalidRule(f"field 'rule' has unknown fields {unknown}")
        if "after_rows" not in data:
            raise InvalidRule("field 'rule' must name 'after_rows': the rows to compare first")
        return cls(
            data["after_rows"],
            data.get("max_label_disagreement", 0.0),
            data.get("max_abs_diff"),
        )


class Shadow(NamedTuple):
    """A model's shadow setting: the version mirrored to, the share mirrored, its rule."""

    version: str
    share: float
    rule: ShadowRule | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "share": self.share}
        if self.rule is not None:
            out["rule"] = self.rule.to_json()
        return out


class Verdict(enum.Enum):
    PROMOTE = "promote"
    REJECT = "reject"


@dataclass
class Tally:
    """What one replica has compared for one shadow setting."""

    rows: int = 0
    label_disagreements: int = 0
    max_abs_diff: float = 0.0
    decided: bool = False

    def add(self, found: Divergence) -> None:
        self.rows += found.rows
        self.label_disagreements += found.label_disagreements
        self.max_abs_diff = max(self.max_abs_diff, *found.max_abs_diff.values(), 0.0)

    def verdict(self, rule: ShadowRule) -> Verdict | None:
        """PROMOTE once ``rule.after_rows`` rows are compared and the shadow agreed on them;
        REJECT then if it did not, or earlier as soon as it cannot agree on ``after_rows``
        rows any more; else None (not yet)."""
        if rule.max_abs_diff is not None and self.max_abs_diff > rule.max_abs_diff:
            return Verdict.REJECT
        ratio = rule.max_label_disagreement
        if self.rows >= rule.after_rows:
            agreed = self.label_disagreements <= ratio * self.rows
            return Verdict.PROMOTE if agreed else Verdict.REJECT
        if self.label_disagreements > ratio * rule.after_rows:
            return Verdict.REJECT
        return None
