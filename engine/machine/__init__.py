"""This machine and how a model fits on it: the native libraries picked for the CPU
(native.py), the devices as llama.cpp sees them (probe.py) as frozen facts
(hardware.py), the placement planner, a pure function (planner.py), its calibration by
measured loads (calibration.py), and llama.cpp's RPC server for workers (rpc.py)."""
