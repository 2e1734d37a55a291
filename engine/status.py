"""The engine's figures as its status routes answer them (GET /health, /v1/cluster): what
is loaded where, what it measured against the plan, the queues, caches, adapters,
routing and replicas. Read from the engine's parts; nothing here changes them."""

from __future__ import annotations


def engine_status(engine) -> dict:
    """The engine's status, as GET /health answers it."""
    main = engine.fleet.main
    host, loaded = main.host, main.host.loaded
    batching = dict(main.published)
    companion, routing = engine.router.companion, engine.router.pair
    return {
        "model": _model_id(loaded),
        "n_ctx": loaded.llama.n_ctx if loaded else None,
        "flash_attn": loaded.llama.flash_attn if loaded else None,
        "offload": offload(loaded, host.cluster),
        "no_gpu_driver": bool(host.hardware and host.hardware.no_gpu_driver),
        "gpu_runtime": engine.gpu_runtime.status() if engine.gpu_runtime else None,
        "busy": bool(batching.get("active")),
        "memory": loaded.memory if loaded else None,
        "load_notes": list(loaded.notes) if loaded else [],
        "load_error": host.load_error,
        "loading": None if host.loading is None else {
            "model": host.loading[0], "progress": round(host.loading[1], 3)},
        "prompt_cache": cache_status(loaded),
        "queued": main.queued,
        "max_queue": engine.settings.max_queue,
        "batching": batching,
        "embedding_model": engine.embedder.model.id if engine.embedder.model else None,
        "models": (models := engine.fleet.loaded()),
        "home": home_status(engine, models),
        "replicas": engine.replicas.status() if engine.replicas else [],
        "adapters": {"loaded": loaded.adapters.loaded() if loaded else [],
                     "switches": loaded.adapters.switches if loaded else 0},
        "response_cache": engine.answers.status() if engine.answers else None,
        "routing": None if routing is None else {
            **routing.as_dict(), "together": companion is not None,
            "companion": None if companion is None else {
                "model": _model_id(companion.host.loaded),
                "load_error": companion.host.load_error,
                "batching": dict(companion.published)}},
    }


def loaded_models(engine) -> list[dict]:
    """The chat models held: where, how much, idle since, time to live (/v1/models/loaded,
    Ollama's /api/ps)."""
    return engine.fleet.loaded()


def home_status(engine, models: list[dict] | None = None) -> dict:
    """Sharing with the home: whether it is on, the devices, who waits for a turn and why
    (`models`: the loaded ones, when already read)."""
    models = engine.fleet.loaded() if models is None else models
    waiting = [{**w, "model": m["id"]} for m in models for w in m.get("waiting", ())]
    return {**engine.home.status(), "waiting": waiting}


def offload(loaded, cluster) -> str:
    """Where the layers run, in a few words."""
    machines = {s.machine for s in cluster.last.stages} if cluster and cluster.last else ()
    if loaded and len(machines) > 1:
        return f"{len(machines)} machines"
    n_gpu_layers = loaded.llama.settings.n_gpu_layers if loaded else 0
    return f"{n_gpu_layers} layers on GPU" if n_gpu_layers else "CPU"


def cluster_status(engine) -> dict | None:
    """The cluster's machines and stages with the main lane's figures; None without one."""
    main = engine.fleet.main
    cluster = main.host.cluster
    if cluster is None:
        return None
    published = main.published
    return {**cluster.status(main.evaluated_tokens()),
            "plan": cluster.last.as_dict() if cluster.last else None,
            "tokens_per_s": published.get("generated_tokens_per_s"),
            "generated_tokens": published.get("generated_tokens")}


def cache_status(loaded) -> dict | None:
    """The loaded model's prompt cache: entries, bytes in RAM and on disk, hits."""
    if not loaded or not loaded.cache:
        return None
    cache = loaded.cache
    return {"entries": len(cache.entries()), "ram_bytes": cache.ram_bytes(),
            "disk_bytes": cache.disk_bytes(), **cache.stats}


def _model_id(loaded) -> str | None:
    return loaded.model.id if loaded else None
