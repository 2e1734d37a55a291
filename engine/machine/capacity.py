"""What this machine can run, in one line for a new user: the largest model that fits at
Q4 and how fast a common 8B model would write. Pure: the planner's budgets and the
forecast's speeds over frozen hardware facts, for the app's welcome."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .forecast import speeds_of
from .hardware import Hardware
from .memory import budgets
from .planner import Preferences

Q4_BYTES_PER_PARAM = 4.85 / 8  # Q4_K_M's mix, on average
HEADROOM = 0.85                 # the rest: KV cache, compute buffers, the app itself
COMMON_PARAMS = 8e9             # the size people ask about first


@dataclass(frozen=True)
class Capacity:
    max_params: float     # the largest dense model at Q4 that fits, in parameters
    usable_bytes: int     # RAM and VRAM the planner would use
    common_params: float  # the model size the speed is given for
    decode_tps: float     # its forecast tokens/s
    summary: str          # in words

    def as_dict(self) -> dict:
        return asdict(self)


def capacity(hw: Hardware, prefs: Preferences = Preferences()) -> Capacity:
    gpus, cpu = budgets(hw, prefs)
    usable = max(cpu, 0) + sum(b for _, b in gpus)
    max_params = usable * HEADROOM / Q4_BYTES_PER_PARAM
    common = min(COMMON_PARAMS, max_params)
    # measured against forecast on this machine (calibration.py), once a load has run
    measured = dict(prefs.speed_calibration).get(f"decode/{'gpu' if gpus else 'cpu'}/dense", 1.0)
    tps = _decode_tps(hw, gpus, common * Q4_BYTES_PER_PARAM) * measured
    return Capacity(max_params, usable, common, tps, _summary(hw, max_params, common, tps))


def _decode_tps(hw: Hardware, gpus: list[tuple[str, int]], weights: float) -> float:
    """Each token reads every weight once: the GPUs' share at their speed, the rest at
    the CPU's (the forecast's bandwidth model, whole layers on the biggest GPUs first)."""
    speeds, seconds, left = speeds_of(hw), 0.0, weights
    for name, budget in sorted(gpus, key=lambda g: -g[1]):
        share = min(left, budget * HEADROOM)
        seconds += share / speeds[name][1]
        left -= share
    seconds += left / speeds["CPU"][1]
    return 1 / seconds if seconds else 0.0


def _summary(hw: Hardware, max_params: float, common: float, tps: float) -> str:
    ram = f"{hw.ram_total_bytes / 1e9:.0f} GB RAM"
    gpu = ", ".join(f"{g.description or g.name} ({g.total_bytes / 1e9:.0f} GB)" for g in hw.gpus)
    size = f"{max_params / 1e9:.0f}B" if max_params >= 1e9 else f"{max_params / 1e6:.0f}M"
    billions = f"{common / 1e9:.0f}"
    article = "an" if billions.startswith(("8", "11", "18")) else "a"
    rate = f"about {tps:.0f} token{'' if round(tps) == 1 else 's'} a second"
    speed = f"{article} {billions}B model writes {rate}" if common >= 1e9 else rate
    return (f"{ram}, {gpu or 'no GPU'}: models up to about {size} parameters fit at Q4; "
            f"{speed}.")
