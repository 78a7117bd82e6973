"""`cascade deploy --gateways N`: Kubernetes manifests for N `cascade serve` gateways (docs/scaling.md).

A Deployment (readiness on `/ready`, which a draining gateway or one with no tier that can serve fails, liveness
on `/health`; the config and plan from the ConfigMap `cascade-config`, which holds no secret of ours: create it
with kubectl), a Service, a PodDisruptionBudget (one gateway down at a time) and a HorizontalPodAutoscaler on the
gateways' own metric `cascade_in_flight_requests` per pod (a Pods metric: it needs a custom-metrics
adapter, e.g. prometheus-adapter, that serves it from the pods' /metrics). /metrics and /ready's detail are on the
pods' monitoring port (`--monitoring-port`, cascade/gateway/monitoring.py), which the Prometheus annotations name;
the Service exposes the clients' port only, and the probes check it. Plain dicts; written as JSON, which kubectl reads
like YAML.
"""

from __future__ import annotations

from dataclasses import dataclass

from cascade.errors import ConfigError

NAME = "cascade"
PORT = 8000
MONITORING_PORT = 29000  # /metrics and /ready's detail; SGLang's model gateway serves its metrics on this port too
IN_FLIGHT_METRIC = "cascade_in_flight_requests"  # cascade/service/metrics.py
CONFIG_DIR = "/etc/cascade"


@dataclass(frozen=True)
class Gateways:
    """What the manifests deploy: `replicas` gateways of `image`, scaled between them and `max_replicas` to
    keep about `in_flight_per_pod` requests on each; `grace_s` lets streams finish on a scale-down."""

    replicas: int
    image: str
    max_replicas: int
    in_flight_per_pod: int = 8
    grace_s: int = 60


def manifests(g: Gateways) -> dict[str, dict[str, object]]:
    """File stem -> manifest."""
    if g.max_replicas < g.replicas:
        raise ConfigError(f"--max-gateways {g.max_replicas} is below --gateways {g.replicas}")
    if g.in_flight_per_pod < 1:
        raise ConfigError(f"--hpa-in-flight must be at least 1, got {g.in_flight_per_pod}")
    labels = {"app.kubernetes.io/name": NAME}
    meta: dict[str, object] = {"name": NAME, "labels": labels}
    return {"deployment": _deployment(g, meta, labels),
            "service": {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
                "selector": labels, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}},
            "pdb": {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}},
            "hpa": {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta, "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
                "minReplicas": g.replicas, "maxReplicas": g.max_replicas,
                "metrics": [{"type": "Pods", "pods": {
                    "metric": {"name": IN_FLIGHT_METRIC},
                    "target": {"type": "AverageValue", "averageValue": str(g.in_flight_per_pod)}}}],
                # Scale down slowly: a removed gateway drains its streams first.
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300,
                                           "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]}}}}}


def _deployment(g: Gateways, meta: dict[str, object], labels: dict[str, str]) -> dict[str, object]:
    args = ["serve", "--config", f"{CONFIG_DIR}/cascade.toml", "--plan", f"{CONFIG_DIR}/plan.json",
            "--host", "0.0.0.0", "--port", str(PORT), "--monitoring-port", str(MONITORING_PORT)]
    container = {
        "name": "gateway", "image": g.image, "command": ["cascade"], "args": args,
        "ports": [{"name": "http", "containerPort": PORT}, {"name": "monitoring", "containerPort": MONITORING_PORT}],
        # Both answer from the gateway's memory (engines are probed in the background), in well under a millisecond.
        # Readiness as Envoy checks it (cascade/deploy/envoy.py): out after 2 checks in a row that fail (503: no
        # tier can serve, or draining) or get no answer within 1 s (a stuck event loop), in after 1 that passes.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "timeoutSeconds": 1, "periodSeconds": 2,
                           "failureThreshold": 2, "successThreshold": 1},
        # Liveness restarts the pod and cuts its streams: dead is 3 checks 10 s apart without an answer within 5 s,
        # not an event loop busy for a few seconds.
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5, "periodSeconds": 10,
                          "failureThreshold": 3},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
        "replicas": g.replicas, "selector": {"matchLabels": labels},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            "metadata": {"labels": labels, "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": str(MONITORING_PORT),
                "prometheus.io/path": "/metrics"}},
            "spec": {"terminationGracePeriodSeconds": g.grace_s, "containers": [container],
                     "volumes": [{"name": "config", "configMap": {"name": "cascade-config"}}]}}}}
