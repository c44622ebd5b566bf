"""What an uploaded model file may be, and the errors for what it may not.

Every refusal is an :class:`ArtifactError` (a ``ValueError``) whose message names the problem, so
the HTTP layer can map the whole family to a 4xx without knowing the formats.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


class ArtifactError(ValueError):
    """An uploaded model file cannot be loaded; the message names the format and the problem."""


class UntrustedTypeError(ArtifactError):
    """A skops file references types outside the server's allow-list."""

    def __init__(self, types: list[str], notes: list[str] | None = None) -> None:
        self.types = sorted(types)
        message = "skops file references types outside the server's allow-list: " + ", ".join(
            self.types
        )
        if notes:
            message += "\n" + "\n".join(notes)
        super().__init__(message)


class PickleNotAllowedError(ArtifactError):
    """A pickle / joblib file was uploaded while pickle loading is disabled."""


class ArtifactTooLargeError(ArtifactError):
    """The file, or a size it declares, exceeds an :class:`ArtifactLimits` bound."""


@dataclass(frozen=True)
class ArtifactLimits:
    """Bounds checked on the bytes *before* any parser allocates what a file declares.

    ``max_ratio`` is the zip compression ratio (uncompressed / compressed) above which a skops
    archive is treated as a zip bomb; ``max_features`` bounds the feature count a booster file
    declares (LightGBM and XGBoost allocate per declared feature).
    """

    max_uncompressed_bytes: int = 512 * MiB
    max_ratio: float = 200.0
    max_members: int = 10_000
    max_trees: int = 100_000
    max_leaves_per_tree: int = 1_000_000
    max_features: int = 1_000_000

    def __post_init__(self) -> None:
        for name in (
            "max_uncompressed_bytes",
            "max_ratio",
            "max_members",
            "max_trees",
            "max_leaves_per_tree",
            "max_features",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"ArtifactLimits.{name} must be positive, got {getattr(self, name)!r}"
                )


def too_large(
    what: str, value: int | float, limit: int | float, field: str
) -> ArtifactTooLargeError:
    """The error for a declared size over its limit (``field`` names the ArtifactLimits knob)."""
    return ArtifactTooLargeError(f"{what} is {value:,}, over the limit of {limit:,} ({field})")
