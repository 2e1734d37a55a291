"""What the engine is started with: how a model loads (LoadSettings), the prompt cache's
limits (CacheLimits) and everything else the command line sets (EngineSettings). Frozen
values at the bottom of the engine, so that every room reads them without importing the
room that uses them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

BLOCK = 32  # tokens: the prompt cache's unit (model/prompt_cache.py)


@dataclass(frozen=True)
class LoadSettings:
    n_ctx: int = 4096  # the tokens one sequence (a conversation) may hold
    n_batch: int = 512
    n_threads: int = 2
    n_gpu_layers: int = 0
    n_seq_max: int = 1  # the KV sequences the context keeps
    # Each sequence its own stream of n_ctx cells (llama.cpp's split KV cache, the
    # planner's choice when every lane's whole context fits: a token attends to its own
    # cells only), rather than one pool of n_ctx cells all share (kv_unified).
    kv_split: bool = False
    kv_type: str = "f16"  # or "q8_0" (needs flash attention)
    devices: tuple[str, ...] = ()  # the GPUs to use, by ggml device name
    tensor_split: tuple[float, ...] = ()  # their shares of the GPU layers
    # llama.cpp's extra buffer types: CPU weights repacked for its fastest kernels (AMX
    # tiles on CPUs that have them). Off after such an evaluation killed an engine.
    repack: bool = True
    embeddings: bool = False  # pooled embeddings out instead of logits (embedding models)
    cpu_moe_layers: int = 0  # leading layers whose routed experts go to expert_device
    expert_device: str = "CPU"  # this process's RAM, or a worker's device (RPC0)
    split_mode: str = "layer"  # or "tensor": every layer split across `devices`

    @property
    def moves_experts(self) -> bool:
        """Whether routed experts go elsewhere than their layers (with every layer in
        RAM, only to a worker's device)."""
        return bool(self.cpu_moe_layers) and (bool(self.n_gpu_layers)
                                              or self.expert_device != "CPU")


@dataclass(frozen=True)
class CacheLimits:
    ram_bytes: int
    disk_bytes: int
    min_tokens: int = BLOCK  # shorter matches are not worth a restore


MAX_LANES = 16  # requests at once when --parallel is not set, at most (machine/planner.lanes)


@dataclass(frozen=True)
class EngineSettings:
    load: LoadSettings = LoadSettings()
    max_queue: int = 16               # requests waiting for a slot
    parallel: int | None = None       # requests generating at once, in one batch; None:
                                      # the plan's lanes (as many as the context holds)
    resident: int = 4                 # finished conversations kept in KV memory
    kv_layout: str = "auto"           # "split", "unified", or the planner's (memory.Preferences)
    cache: CacheLimits | None = None  # None: no prompt cache
    cache_folder: Path | None = None  # None: RAM tier only
    speculation: str = "off"          # the default for requests that do not say
    calibration_file: Path | None = None  # measured/predicted memory ratios
    load_journal: Path | None = None      # the load in progress (see loader.py)
    no_repack_file: Path | None = None    # models whose repacked weights killed an engine
    spec_min_speedup: float = 0.95    # below this measured gain speculation turns off
    draft_folder: Path | None = None  # cut drafts (speculation/cut_draft.py); None: whole
    ram_budget: int | None = None     # bytes of RAM the plans may use; None: what is free
    response_cache: Path | None = None  # the answers' SQLite file (response_cache.py)
    response_cache_bytes: int = 256 << 20
    cpu_moe_layers: int | None = None  # experts of this many layers in RAM; None: planned
    batch_invariant: bool = False     # batched greedy equal to solo, at repacking's cost
    max_models: int = 3               # chat models loaded at once (fleet.py), memory allowing
    jit_ttl_s: float | None = 900.0   # a model loaded on demand is unloaded this long idle
    presets_file: Path | None = None  # the user's per-model choices (presets.py)
    auto_ctx: bool = False            # load.n_ctx not asked: the planner chooses (up to 32k)
    tensor_parallel: bool = False     # the planner may split every layer across GPUs
    image_urls: bool = False          # requests' http(s) images fetched (off: data URLs only)
    image_hosts: frozenset[str] = frozenset()  # non-public hosts those images may come from
    image_tokens: tuple[int, int] = (-1, -1)  # a projector's image_min/max_tokens (-1: its own)
    mcp_config: Path | None = None    # the user's MCP servers (engine/tools/config.py)
    tool_approvals: Path | None = None  # the user's allow/ask/deny per tool
    tool_logs: Path | None = None     # the servers' stderr and the log of every call
    request_mcp: bool = False         # a request may name an MCP server by URL
    documents: Path | None = None     # the documents index (engine/documents/); None: none
    home: Path | None = None          # the paired devices and their chats (engine/home/)
    voice: Path | None = None         # the speech models' folder (engine/voice/); None: none

    @property
    def sequences(self) -> int:
        """KV sequences of one shared pool: the active ones, the resident ones, and one
        for measurements (a plan that splits the KV cache sets its own: loader.py)."""
        return (self.parallel or MAX_LANES) + self.resident + 1

    def load_settings(self) -> LoadSettings:
        # Repacked 4-bit weights decode 13-20% faster on x86 (measured at the Qwen3 1.7B-8B
        # shapes), but their kernels round differently for one row than for several
        # (logit gaps near 2): batch invariance gives them up, when asked.
        invariant = self.batch_invariant and (self.parallel or MAX_LANES) > 1
        return replace(self.load, n_seq_max=self.sequences,
                       repack=self.load.repack and not invariant)
