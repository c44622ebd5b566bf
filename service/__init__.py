"""Kestrel service layer: HTTP serving of compiled models.

FastAPI app factory, model store, per-model dynamic batcher, Prometheus metrics, settings
(``KESTREL_`` prefix) and the ``kestrel`` CLI. Imports ``compiler`` and ``lazy``'s public API;
it is the only layer that knows about HTTP, settings or metrics.
"""
