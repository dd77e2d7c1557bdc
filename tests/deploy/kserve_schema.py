"""JSON schemas for KServe's ServingRuntime and InferenceService, for offline checks.

KServe publishes no schema package; these are written from the facts of its
CRDs (serving.kserve.io: ServingRuntimeSpec in v1alpha1, InferenceServiceSpec
and ModelSpec in v1beta1): the field names, their types, which are required.
Kubernetes types inside them (Container, Volume, ObjectMeta...) refer to the
schemas kubernetes-validate ships, so a container in a runtime is checked as
strictly as one in a Deployment. Unknown fields are rejected where KServe's
types are closed, so a misspelt key fails here as it would at the API server.
"""

from __future__ import annotations

from typing import Any

K8S = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s."


def k8s(name: str) -> dict[str, str]:
    """A reference to a Kubernetes type, e.g. ``api.core.v1.Container``."""
    return {"$ref": K8S + name}


def array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


STRING = {"type": "string"}
BOOLEAN = {"type": "boolean"}
INTEGER = {"type": "integer"}
STRING_MAP = {"type": "object", "additionalProperties": STRING}
# KServe's protocol constants (constants.InferenceServiceProtocol).
PROTOCOL = {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}

MODEL_FORMAT = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": STRING,
        "version": STRING,
        "autoSelect": BOOLEAN,
        "priority": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}

SERVING_RUNTIME_SPEC = {
    "type": "object",
    "required": ["containers"],
    "properties": {
        "supportedModelFormats": array(MODEL_FORMAT),
        "multiModel": BOOLEAN,
        "disabled": BOOLEAN,
        "protocolVersions": array(PROTOCOL),
        "containers": {**array(k8s("api.core.v1.Container")), "minItems": 1},
        "volumes": array(k8s("api.core.v1.Volume")),
        "nodeSelector": STRING_MAP,
        "affinity": k8s("api.core.v1.Affinity"),
        "tolerations": array(k8s("api.core.v1.Toleration")),
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
        "imagePullSecrets": array(k8s("api.core.v1.LocalObjectReference")),
        "hostIPC": BOOLEAN,
        "replicas": INTEGER,
        "grpcEndpoint": STRING,
        "grpcDataEndpoint": STRING,
        "httpDataEndpoint": STRING,
        "storageHelper": {"type": "object", "properties": {"disabled": BOOLEAN}},
        "builtInAdapter": {"type": "object"},
        "workerSpec": {"type": "object"},
    },
    "additionalProperties": False,
}

# ModelSpec: a Container's fields inline, and where the model comes from.
MODEL_SPEC = {
    "type": "object",
    "required": ["modelFormat"],
    "properties": {
        "modelFormat": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": STRING, "version": STRING},
            "additionalProperties": False,
        },
        "runtime": STRING,
        "runtimeVersion": STRING,
        "protocolVersion": PROTOCOL,
        "storageUri": STRING,
        "storage": {"type": "object"},
        "name": STRING,
        "image": STRING,
        "command": array(STRING),
        "args": array(STRING),
        "env": array(k8s("api.core.v1.EnvVar")),
        "ports": array(k8s("api.core.v1.ContainerPort")),
        "resources": k8s("api.core.v1.ResourceRequirements"),
        "volumeMounts": array(k8s("api.core.v1.VolumeMount")),
        "readinessProbe": k8s("api.core.v1.Probe"),
        "livenessProbe": k8s("api.core.v1.Probe"),
        "startupProbe": k8s("api.core.v1.Probe"),
        "lifecycle": k8s("api.core.v1.Lifecycle"),
        "securityContext": k8s("api.core.v1.SecurityContext"),
    },
    "additionalProperties": False,
}

# PredictorSpec: a pod spec inline (left open here: its keys are Kubernetes'),
# the component's scaling fields, and the model.
PREDICTOR_SPEC = {
    "type": "object",
    "properties": {
        "model": MODEL_SPEC,
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "scaleTarget": INTEGER,
        "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
        "containerConcurrency": INTEGER,
        "timeout": INTEGER,
        "canaryTrafficPercent": INTEGER,
        "serviceAccountName": STRING,
        "containers": array(k8s("api.core.v1.Container")),
        "volumes": array(k8s("api.core.v1.Volume")),
    },
}


def resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": k8s("apimachinery.pkg.apis.meta.v1.ObjectMeta"),
            "spec": spec,
            "status": {"type": "object"},
        },
        "additionalProperties": False,
    }


V1ALPHA1 = "serving.kserve.io/v1alpha1"
SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    (V1ALPHA1, "ServingRuntime"): resource(V1ALPHA1, "ServingRuntime", SERVING_RUNTIME_SPEC),
    (V1ALPHA1, "ClusterServingRuntime"): resource(
        V1ALPHA1, "ClusterServingRuntime", SERVING_RUNTIME_SPEC
    ),
    ("serving.kserve.io/v1beta1", "InferenceService"): resource(
        "serving.kserve.io/v1beta1",
        "InferenceService",
        {
            "type": "object",
            "required": ["predictor"],
            "properties": {
                "predictor": PREDICTOR_SPEC,
                "transformer": {"type": "object"},
                "explainer": {"type": "object"},
            },
            "additionalProperties": False,
        },
    ),
}
