"""The demo model ``kestrel serve --demo`` registers: iris, fitted on a DataFrame, string labels.

It goes through the same path as any upload (skops bytes → allow-listed load → compile → warm →
parity), so a fresh checkout shows the whole service working with nothing else installed.
"""

from __future__ import annotations

import io
import logging
from typing import Any

from service.models import ModelManager
from service.versions import ModelOptions, Upload

log = logging.getLogger("kestrel.demo")

DEMO_NAME = "iris"
COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def demo_pipeline() -> tuple[Any, list[dict[str, float]]]:
    """A fitted StandardScaler → LogisticRegression on iris, and its sample: the whole data set
    (the reference of its drift metrics)."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    data = load_iris(as_frame=True)
    x = data.data.set_axis(COLUMNS, axis=1)
    y = data.target_names[data.target]
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x, y)
    sample = x.to_dict(orient="records")
    return pipeline, sample


def demo_artifact() -> tuple[bytes, list[dict[str, float]]]:
    """The demo pipeline as ``.skops`` bytes, and its sample rows."""
    import skops.io as sio

    pipeline, sample = demo_pipeline()
    buffer = io.BytesIO(sio.dumps(pipeline))
    return buffer.getvalue(), sample


async def register_demo(manager: ModelManager) -> None:
    """Register the demo model unless the store already has one of that name."""
    if manager.knows(DEMO_NAME):
        return
    data, sample = demo_artifact()
    mv = await manager.register(
        Upload(
            name=DEMO_NAME,
            data=data,
            filename="iris.skops",
            format="skops",
            sample=sample,
            options=ModelOptions(max_batch=256),
        )
    )
    await manager.wait(mv, 600)
    log.info("demo model %r version %s is %s", DEMO_NAME, mv.version, mv.state.value)
