"""JSON Schemas for the custom resources in deploy/k8s, which kubernetes-validate does not know.

Each schema keeps the published CRD's required fields and types for the parts of the resource the
manifests use, and refuses any other field (``additionalProperties: false``) so a misspelt key
fails instead of being ignored by the API server's pruning. Embedded Kubernetes types (Container,
Volume, LabelSelector, ObjectMeta, HPA behavior) are checked against kubernetes-validate's own
definitions of the core API, in strict mode.

Sources:
- ScaledObject: kedacore/keda ``config/crd/bases/keda.sh_scaledobjects.yaml`` (spec requires
  ``scaleTargetRef`` with ``name``, and ``triggers`` each with ``type`` and string-valued
  ``metadata``; trigger ``metricType`` is AverageValue, Value or Utilization).
- ServiceMonitor: prometheus-operator ``monitoring.coreos.com_servicemonitors.yaml`` (spec
  requires ``selector``; endpoint ``interval`` / ``scrapeTimeout`` are Prometheus durations).
- ClusterServingRuntime: kserve ``pkg/apis/serving/v1alpha1/servingruntime_types.go`` (spec
  requires ``containers``; each supported model format requires ``name``; ``priority`` >= 1;
  protocol versions v1, v2, grpc-v1, grpc-v2). Cluster-scoped: no namespace.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

import jsonschema
from referencing import Registry, Resource

DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
# Prometheus' duration syntax, as the prometheus-operator CRDs declare it.
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


def core(name: str) -> dict[str, str]:
    return {"$ref": DEFS + name}


def closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object with exactly these (optional unless required) properties."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def resource(api_version: str, kind: str, spec: dict[str, Any], *, cluster: bool = False):
    metadata: dict[str, Any] = {"allOf": [core("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")]}
    metadata["required"] = ["name"]
    if cluster:
        metadata["not"] = {"required": ["namespace"]}
    return closed(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": metadata,
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

SCALED_OBJECT = resource(
    "keda.sh/v1alpha1",
    "ScaledObject",
    closed(
        {
            "scaleTargetRef": closed(
                {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "name": {"type": "string", "minLength": 1},
                    "envSourceContainerName": {"type": "string"},
                },
                ("name",),
            ),
            "pollingInterval": INT32,
            "cooldownPeriod": INT32,
            "minReplicaCount": INT32,
            "maxReplicaCount": INT32,
            "advanced": closed(
                {
                    "restoreToOriginalReplicaCount": {"type": "boolean"},
                    "horizontalPodAutoscalerConfig": closed(
                        {
                            "name": {"type": "string"},
                            "behavior": core(
                                "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior"
                            ),
                        }
                    ),
                }
            ),
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": closed(
                    {
                        "type": {"type": "string", "minLength": 1},
                        "name": {"type": "string"},
                        "metadata": STRING_MAP,
                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                        "useCachedMetrics": {"type": "boolean"},
                        "authenticationRef": closed(
                            {"name": {"type": "string"}, "kind": {"type": "string"}}, ("name",)
                        ),
                    },
                    ("type", "metadata"),
                ),
            },
        },
        ("scaleTargetRef", "triggers"),
    ),
)

SERVICE_MONITOR = resource(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    closed(
        {
            "selector": core("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"),
            "jobLabel": {"type": "string"},
            "namespaceSelector": closed(
                {"any": {"type": "boolean"}, "matchNames": {"type": "array"}}
            ),
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": closed(
                    {
                        "port": {"type": "string"},
                        "targetPort": {"type": ["integer", "string"]},
                        "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https"]},
                        "interval": {"type": "string", "pattern": DURATION},
                        "scrapeTimeout": {"type": "string", "pattern": DURATION},
                        "honorLabels": {"type": "boolean"},
                    }
                ),
            },
        },
        ("selector",),
    ),
)

CLUSTER_SERVING_RUNTIME = resource(
    "serving.kserve.io/v1alpha1",
    "ClusterServingRuntime",
    closed(
        {
            "supportedModelFormats": {
                "type": "array",
                "items": closed(
                    {
                        "name": {"type": "string", "minLength": 1},
                        "version": {"type": "string"},
                        "autoSelect": {"type": "boolean"},
                        "priority": {"type": "integer", "minimum": 1},
                    },
                    ("name",),
                ),
            },
            "multiModel": {"type": "boolean"},
            "disabled": {"type": "boolean"},
            "protocolVersions": {
                "type": "array",
                "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
            },
            "containers": {
                "type": "array",
                "minItems": 1,
                "items": core("io.k8s.api.core.v1.Container"),
            },
            "volumes": {"type": "array", "items": core("io.k8s.api.core.v1.Volume")},
            "nodeSelector": STRING_MAP,
            "labels": STRING_MAP,
            "annotations": STRING_MAP,
        },
        ("containers",),
    ),
    cluster=True,
)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): CLUSTER_SERVING_RUNTIME,
}


def _core_definitions(kubernetes_version: str) -> Resource[Any]:
    """kubernetes-validate's strict definitions of the core API for ``kubernetes_version``."""
    path = files("kubernetes_validate").joinpath(
        f"kubernetes-json-schema/v{kubernetes_version}-local-strict/_definitions.json"
    )
    return Resource.from_contents(json.loads(path.read_text()))


def validate_custom(doc: dict[str, Any], kubernetes_version: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``doc`` fits its custom resource's schema."""
    schema = SCHEMAS[(doc["apiVersion"], doc["kind"])]
    registry: Registry[Any] = _core_definitions(kubernetes_version) @ Registry()
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)
