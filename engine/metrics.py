"""The engine's status as Prometheus metrics (the names follow llama.cpp's server where
it has the same figure: requests processing/deferred, tokens per second, KV use)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

GAUGES = {  # status["batching"] key -> (metric, help)
    "active": ("requests_processing", "Requests generating now."),
    "prefilling": ("requests_prefilling", "Active requests still evaluating their prompt."),
    "resident": ("sequences_resident", "Finished conversations kept in KV memory."),
    "parallel": ("slots", "Requests that can generate at once."),
    "kv_cells_used": ("kv_cells_used", "KV cells holding tokens, shared cells counted once."),
    "kv_cells_total": ("kv_cells_total", "KV cells in the pool all sequences share."),
    "prompt_tokens_per_s": ("prompt_tokens_seconds", "Prompt tokens per second, last 10 s."),
    "generated_tokens_per_s": ("predicted_tokens_seconds", "Tokens generated per second, last 10 s."),
}
COUNTERS = {
    "prompt_tokens": ("prompt_tokens", "Prompt tokens evaluated."),
    "generated_tokens": ("tokens_predicted", "Tokens generated."),
    "requests": ("requests", "Requests admitted."),
    "steps": ("decode_steps", "Batched evaluation steps."),
    "evictions": ("sequences_evicted", "Resident conversations moved to the prompt cache."),
    "memory_full": ("kv_memory_full", "Requests failed because the KV memory ran out."),
    "kv_mismatches": ("kv_mismatches", "Sequences whose cells held other tokens than their "
                      "slot's record, cut back to the true common prefix before use."),
}


class _Status:
    def __init__(self, status: dict):
        self.status = status

    def collect(self):
        batching = self.status.get("batching") or {}
        queued = GaugeMetricFamily("homerack_requests_deferred", "Requests waiting in the queue.")
        queued.add_metric([], self.status.get("queued", 0))
        yield queued
        for key, (name, text) in GAUGES.items():
            metric = GaugeMetricFamily(f"homerack_{name}", text)
            metric.add_metric([], batching.get(key, 0))
            yield metric
        for key, (name, text) in COUNTERS.items():
            metric = CounterMetricFamily(f"homerack_{name}", text)
            metric.add_metric([], batching.get(key, 0))
            yield metric
        adapters = self.status.get("adapters") or {}
        loaded = GaugeMetricFamily("homerack_adapters_loaded", "LoRA adapters loaded.")
        loaded.add_metric([], len(adapters.get("loaded", ())))
        yield loaded
        switches = CounterMetricFamily("homerack_adapter_switches",
                                       "Changes of the adapters the context applies.")
        switches.add_metric([], adapters.get("switches", 0))
        yield switches
        yield from _per_model(self.status.get("models") or ())
        yield from _per_replica(self.status.get("replicas") or ())


PER_MODEL = {  # status["models"] entry key -> (metric, help)
    "running": ("model_requests_processing", "Requests generating now, per loaded model."),
    "queued": ("model_requests_deferred", "Requests waiting, per loaded model."),
    "idle_s": ("model_idle_seconds", "Seconds since the model's last request, per loaded model."),
    "generated_tokens_per_s": ("model_predicted_tokens_seconds",
                               "Tokens generated per second, last 10 s, per loaded model."),
}


def _per_model(models):
    """The models held at once (fleet.py), each a series labelled with its id."""
    held = GaugeMetricFamily("homerack_model_memory_bytes", "Bytes a loaded model holds, per "
                             "device.", labels=["model", "device"])
    for entry in models:
        for device, size in entry["memory"].items():
            held.add_metric([entry["id"], device], size)
    yield held
    errors = CounterMetricFamily("homerack_model_errors", "Requests ended because the model "
                                 "computed NaN or infinite logits, per loaded model.",
                                 labels=["model"])
    for entry in models:
        errors.add_metric([entry["id"]], entry.get("model_errors", 0))
    yield errors
    for key, (name, text) in PER_MODEL.items():
        metric = GaugeMetricFamily(f"homerack_{name}", text, labels=["model"])
        for entry in models:
            metric.add_metric([entry["id"]], entry.get(key) or 0)
        yield metric


def prometheus_text(status: dict) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Status(status))
    return generate_latest(registry), CONTENT_TYPE_LATEST


def _per_replica(replicas):
    """The machines serving whole models behind this front door (cluster/replicas.py)."""
    up = GaugeMetricFamily("homerack_replica_up", "1 while a replica answers its polls.",
                           labels=["machine"])
    busy = GaugeMetricFamily("homerack_replica_busy", "A replica's requests running and "
                             "queued, per slot.", labels=["machine"])
    sent = CounterMetricFamily("homerack_replica_requests", "Requests sent to a replica.",
                               labels=["machine"])
    for replica in replicas:
        up.add_metric([replica["name"]], replica["state"] == "serving")
        busy.add_metric([replica["name"]], replica.get("busy", 0))
        sent.add_metric([replica["name"]], replica["requests_sent"])
    yield from (up, busy, sent)
