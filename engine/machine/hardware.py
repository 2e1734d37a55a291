"""The machine as llama.cpp sees it, as a frozen value: its devices with their memory,
system RAM and cores (read by probe.py); `simulated` builds one for planning another
machine. Pure data: the planner reads it without loading llama.cpp."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

GiB = 1 << 30
KINDS = ("cpu", "gpu", "igpu", "accel", "meta")  # enum ggml_backend_dev_type


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    kind: str
    free_bytes: int
    total_bytes: int
    bandwidth: float = 0.0  # bytes/s it reads (0: unknown; the planner assumes a prior)
    flops: float = 0.0      # FLOP/s it computes (0: unknown)
    gpu_id: str = ""        # the GPU's PCI bus id as its backend reports it ("": unknown)


@dataclass(frozen=True)
class Hardware:
    devices: tuple[Device, ...]
    ram_total_bytes: int
    ram_available_bytes: int
    cpu_cores: int
    unified_memory: bool = False  # GPUs share system RAM (Apple silicon)
    cpu_repack: bool = False      # the CPU backend repacks 4-bit weights (x86 with AVX2)
    cpu_backend: str = ""         # which build of llama.cpp's CPU backend runs (native.py)
    ram_bandwidth: float = 0.0    # bytes/s the CPU reads from RAM (measured; 0: unknown)
    gpu_backends: tuple[str, ...] = ()  # llama.cpp's GPU backends in this build (CUDA, Vulkan)
    same_gpu: tuple[str, ...] = ()  # devices left out as another backend's view of one GPU
    gpu_modules_refused: tuple[str, ...] = ()  # the packaged app's GPU modules not loaded, why

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind in ("gpu", "igpu"))

    @property
    def no_gpu_driver(self) -> bool:
        """This build has a GPU backend and it found no GPU: the driver is missing (or
        there is no GPU): the window and `homerack hardware` say so."""
        return bool(self.gpu_backends) and not self._local_gpus()

    def _local_gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.gpus if not d.name.startswith("RPC"))

    def cpu_only_why(self) -> str | None:
        """Why every layer runs on the CPU, in a line; None where a GPU is there."""
        if self._local_gpus():
            return None
        if not self.gpu_backends:
            return "runs on the CPU: this llama.cpp build has no GPU backend"
        return (f"runs on the CPU: no GPU driver found (llama.cpp's "
                f"{' and '.join(self.gpu_backends)} backend found no GPU)")

    def as_dict(self) -> dict:
        return asdict(self)

    def within(self, ram_bytes: int | None) -> "Hardware":
        """This machine with at most `ram_bytes` of RAM for Homerack (None: all of it)."""
        if ram_bytes is None:
            return self
        devices = tuple(replace(d, free_bytes=min(d.free_bytes, ram_bytes),
                                total_bytes=min(d.total_bytes, ram_bytes))
                        if d.kind == "cpu" else d for d in self.devices)
        return replace(self, devices=devices, ram_total_bytes=min(self.ram_total_bytes, ram_bytes),
                       ram_available_bytes=min(self.ram_available_bytes, ram_bytes))


    def reserving(self, taken: dict[str, int]) -> "Hardware":
        """This machine with `taken` bytes per device already held by other models
        ("CPU": system RAM)."""
        if not any(taken.values()):
            return self
        devices = tuple(replace(d, free_bytes=max(0, d.free_bytes - taken.get(d.name, 0)))
                        for d in self.devices)
        return replace(self, devices=devices,
                       ram_available_bytes=max(0, self.ram_available_bytes - taken.get("CPU", 0)))


def one_backend_per_gpu(devices: tuple[Device, ...]) -> tuple[tuple[Device, ...],
                                                              tuple[str, ...]]:
    """The devices with each GPU once, and a line for each left out. With CUDA's and
    Vulkan's modules both loaded, an NVIDIA card is listed twice (CUDA0 and Vulkan0):
    planned as two GPUs, its memory would be counted twice and the load would fail. As
    llama.cpp does when it picks devices itself (llama_model_load's device list), the first
    in the registry's order is kept — CUDA's, registered before Vulkan's — and a device
    whose backend gives no id is never taken for another."""
    kept, left = [], []
    for device in devices:
        twin = next((k for k in kept if device.gpu_id and k.gpu_id == device.gpu_id), None)
        if twin is None:
            kept.append(device)
        else:
            left.append(f"{device.name} is the GPU {twin.name} runs on ({device.gpu_id}, "
                        f"{twin.description}): planned on {twin.name} only, the first "
                        f"backend llama.cpp registered for it")
    return tuple(kept), tuple(left)


def simulated(vram_gib: tuple[float, ...] = (), ram_gib: float = 16.0, cores: int = 8,
              unified: bool = False, gpu_bandwidth_gbs: float = 0.0,
              ram_bandwidth_gbs: float = 0.0, gpu_tflops: float = 0.0) -> Hardware:
    """A machine to plan for: GPUs with the given memory (and speed: 0 is unknown), and
    system RAM."""
    gpus = tuple(Device(f"GPU{i}", "simulated GPU", "gpu", int(g * GiB), int(g * GiB),
                        gpu_bandwidth_gbs * 1e9, gpu_tflops * 1e12)
                 for i, g in enumerate(vram_gib))
    cpu = Device("CPU", "simulated CPU", "cpu", int(ram_gib * GiB), int(ram_gib * GiB))
    return Hardware(gpus + (cpu,), int(ram_gib * GiB), int(ram_gib * GiB), cores, unified,
                    ram_bandwidth=ram_bandwidth_gbs * 1e9)
