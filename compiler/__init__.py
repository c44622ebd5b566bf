"""Kestrel compiler layer: fitted scikit-learn / LightGBM / XGBoost objects → lazy graphs.

Containers (Pipeline, ColumnTransformer, FeatureUnion, search CV wrappers, …) are flattened by a
parser; pure, registered leaf converters read fitted attributes and emit ``lazy`` IR, and steps
that cannot be expressed as tensors become host steps between compiled segments. Imports
``lazy``, numpy and scikit-learn only — never jax, torch, fastapi or prometheus_client, so a new
backend never touches a converter.
"""
