"""The welcome's line about this machine (engine/machine/capacity.py)."""

from engine.machine.capacity import capacity
from engine.machine.hardware import Device, Hardware
from engine.machine.planner import Preferences

GIB = 2**30


def machine(*gpus: Device) -> Hardware:
    cpu = Device("CPU", "CPU", "cpu", 24 * GIB, 24 * GIB)
    return Hardware((*gpus, cpu), 24 * GIB, 24 * GIB, 8, ram_bandwidth=40e9)


def test_a_cpu_only_machine_says_what_fits_and_how_fast_an_8b_model_writes():
    seen = capacity(machine())
    assert 25e9 < seen.max_params < 40e9
    assert seen.common_params == 8e9 and 2 < seen.decode_tps < 8
    assert seen.summary.startswith("26 GB RAM, no GPU: models up to about")
    assert "an 8B model writes about" in seen.summary


def test_a_gpu_holds_a_common_model_and_makes_it_many_times_faster():
    gpu = Device("CUDA0", "NVIDIA GeForce RTX 4090", "gpu", 24 * GIB, 24 * GIB, 1008e9, 80e12)
    cpu_only, with_gpu = capacity(machine()), capacity(machine(gpu))
    assert with_gpu.max_params > 1.9 * cpu_only.max_params
    assert with_gpu.decode_tps > 10 * cpu_only.decode_tps
    assert "NVIDIA GeForce RTX 4090 (26 GB)" in with_gpu.summary


def test_the_speed_said_is_corrected_by_what_loads_here_measured():
    prior = capacity(machine())
    measured = capacity(machine(), Preferences(speed_calibration=(("decode/cpu/dense", 2.0),
                                                                  ("decode/gpu/dense", 9.0))))
    assert abs(measured.decode_tps - 2 * prior.decode_tps) < 1e-6
    assert measured.max_params == prior.max_params
