"""The compile report: what became device code, what runs on the host, and how big it is."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StepReport:
    path: str  # e.g. "pipeline/preprocess/num/scaler"
    estimator: str  # class name
    where: str  # "device" or "host"
    detail: str = ""  # e.g. the tree strategy chosen
    #: Why the step computes in float64 in a float32 graph ("" where it does not; see
    #: compiler.precision): its own reason, "feeds <path>" or "holds <path>".
    precision: str = ""


@dataclass
class CompileReport:
    steps: list[StepReport] = field(default_factory=list)
    graph_nodes: int = 0
    graph_stages: int = 0
    parameters: int = 0  # number of fitted values passed to the device
    methods: tuple[str, ...] = ()
    #: With explanations (``CompileOptions.explain``): each input column (and ``bias``) → the
    #: features of the explained step whose contributions it sums (:mod:`compiler.explain`).
    contributions: dict[str, list[int]] = field(default_factory=dict)

    @property
    def host_steps(self) -> list[str]:
        return [s.path for s in self.steps if s.where == "host"]

    @property
    def promoted(self) -> dict[str, str]:
        """Step path → why it computes in float64, for the steps promoted from float32."""
        return {s.path: s.precision for s in self.steps if s.precision}

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["host_steps"] = self.host_steps
        data["promoted"] = self.promoted
        return data
