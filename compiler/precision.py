"""Automatic precision: the steps whose float32 answers miss the tolerance compute in float64.

A converter (or its registration, :class:`Precision`) asks for float64 with
:meth:`compiler.context.Context.promote`. The compiler then traces the model again with a
*float64 segment*: the steps that asked and the steps inside them (an ensemble's children), every
step whose output feeds one of them where the request says its inputs must be float64 too (a
GaussianMixture amplifies the rounding of the PowerTransformer before it), and the containers
that route their values. Every other step stays in the options' dtype, with casts where values
cross the segment's border. The compile report names each promoted step and why
(:attr:`compiler.report.StepReport.precision`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import lazy as lz

#: The float tolerance a compiled model promises against its source: relative, scaled by the
#: output's magnitude (the conformance suite's).
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Precision:
    """A registered class whose heads miss the float32 tolerance: it computes in float64.

    ``reason``: one line, for the compile report and docs/operators.md. ``when``: the condition
    in words where it is not every instance (``applies`` decides it on the fitted estimator).
    ``inputs``: whether the steps feeding it must be float64 too (False where the step only
    needs its own arithmetic in float64, as a tree ensemble's leaf sums: its decisions are exact
    on any input precision).
    """

    reason: str
    when: str = ""
    applies: Callable[[Any], bool] | None = None
    inputs: bool = True

    def applies_to(self, estimator: Any) -> bool:
        return self.applies is None or bool(self.applies(estimator))

    def describe(self) -> str:
        """The docs' line: when, what and why."""
        scope = "with the steps feeding it" if self.inputs else "its own arithmetic only"
        when = f"{self.when}: " if self.when else ""
        return f"{when}float64 ({scope}): {self.reason}"


@dataclass(frozen=True)
class Request:
    """One step's ask for float64: its path, why, and the node of the features it read."""

    path: str
    reason: str
    features: lz.Node
    inputs: bool


def segment(
    requests: Iterable[Request], outputs: Mapping[str, tuple[lz.Node, ...]]
) -> dict[str, str]:
    """Path → why, for every step of the float64 segment of ``requests`` (``outputs``: each
    step's output nodes in the trace that made the requests)."""
    requests = list(requests)
    own: dict[str, list[str]] = {}
    for request in requests:  # a step's own reasons first, each once (a reason may hold "; ")
        reasons = own.setdefault(request.path, [])
        if request.reason not in reasons:
            reasons.append(request.reason)
    why = {path: "; ".join(reasons) for path, reasons in own.items()}
    for request in requests:  # a step's own children compute its heads: in float64 too
        for path in outputs:
            if path.startswith(f"{request.path}/"):
                why.setdefault(path, f"inside {request.path}")
    for request in requests:
        if not request.inputs:
            continue
        feeding = _ancestors(request.features)
        for path, nodes in outputs.items():
            if path not in why and any(n in feeding for n in nodes):
                why[path] = f"feeds {request.path}"
    for path in list(why):  # containers route values between the segment's steps
        parts = path.split("/")
        for i in range(1, len(parts)):
            why.setdefault("/".join(parts[:i]), f"holds {path}")
    return why


def _ancestors(node: lz.Node) -> set[lz.Node]:
    """``node`` and every node it is computed from (graph attributes such as loop bodies hold
    no step outputs, so they are not entered)."""
    seen = {node}
    stack = [node]
    while stack:
        for parent in stack.pop().inputs:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen
