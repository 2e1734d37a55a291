"""Continuous batching: one lane per loaded model (lane.py: its queue and the worker
thread that owns its llama.cpp context), whose scheduler (scheduler.py) admits requests
into slots (slot.py) and steps them all in one batch, with KV cells accounted for in
kv_pool.py and token bytes turned into text in text_stream.py."""
