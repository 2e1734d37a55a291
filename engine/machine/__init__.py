"""This machine and how a model fits on it, pure (the facts are read by llama/probe.py):

  hardware.py     the machine as a frozen value: devices, RAM, cores
  planner.py      the planner: (hardware, shape, preferences) -> a frozen Plan
  memory.py       the bytes a placement puts on each device
  forecast.py     how fast a placement will run, before it loads
  bandwidth.py    how fast a device streams weights (RAM measured, GPUs by table)
  calibration.py  what past loads measured against the predictions
  capacity.py     the largest model that fits, in one line for a new user
"""
