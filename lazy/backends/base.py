"""What every backend provides."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..dtypes import DTypePolicy
from ..graph import Graph
from ..node import Node
from ..ops import Op
from ..shapes import concrete


class Executable(Protocol):
    """A graph compiled for one bucket: host arrays in, host arrays out (outputs order). One
    whose ``any_rows`` attribute is true also runs fewer rows than its bucket's, unpadded."""

    def __call__(self, inputs: Sequence[np.ndarray], params: Any) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class CompileTimes:
    trace_s: float = 0.0
    lower_s: float = 0.0
    compile_s: float = 0.0


@dataclass(frozen=True)
class Lowering:
    """What a backend rule sees besides its operands: leaves' values and the static batch."""

    inputs: Mapping[str, Any]
    params: Mapping[str, Any]
    batch: int
    policy: DTypePolicy

    def dtype(self, node: Node) -> str:
        return self.policy.lower(node.dtype)

    def shape(self, node: Node) -> tuple[int, ...]:
        return concrete(node.shape, self.batch)


Rule = Callable[[Node, list[Any], Lowering], Any]


def run_rules(rules: Mapping[Op, Rule], graph: Graph, lowering: Lowering) -> list[Any]:
    """Evaluate ``graph`` with a backend's rule table (during tracing, or eagerly)."""
    env: dict[Node, Any] = {}
    for node in graph.order:
        env[node] = rules[node.op](node, [env[i] for i in node.inputs], lowering)
    return [env[n] for n in graph.output_nodes]


class Backend(abc.ABC):
    """Compiles graphs per bucket and (optionally) serializes the results."""

    name: str
    rules: Mapping[Op, Rule]
    #: Which formulation of a VARIANT this backend runs ("device" or "host"; see lazy.variant).
    target: str = "device"
    #: Whether compute-bound graphs run faster here in calls larger than their intermediates'
    #: L2 budget (see lazy.executor.DENSE_CALL_BYTES): where a call has a fixed cost worth
    #: spreading and elementwise work is fused into few passes (XLA), not where every op is its
    #: own pass over the rows (torch eager, where an MLP ran slower in larger calls).
    dense_calls: bool = False

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """Everything besides the graph that decides what an executable computes and where."""

    @abc.abstractmethod
    def prepare_params(self, values: Sequence[np.ndarray], policy: DTypePolicy) -> Any:
        """Parameter values placed where executables want them (e.g. on the device), once."""

    @abc.abstractmethod
    def compile(
        self, graph: Graph, bucket: int, policy: DTypePolicy
    ) -> tuple[Executable, CompileTimes]: ...

    def serialize(self, executable: Executable) -> bytes | None:
        """Bytes a later process can load instead of compiling; None if unsupported."""
        return None

    def deserialize(self, payload: bytes) -> Executable:
        raise NotImplementedError(f"the {self.name} backend does not load serialized executables")
