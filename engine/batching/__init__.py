"""Continuous batching, one lane per loaded model:

  lane.py         a loaded model, its bounded inbox and the worker thread that owns it
  fairness.py     the requests waiting for a slot, in fair turns between the people asking
  scheduler.py    admit requests into slots; each step scheduled, run, its picks applied
  plan.py         a step scheduled, purely: the adapter set's turn, a draft round or the
                  tokens in each call
  run.py          a plan carried out: the llama.cpp calls and the sampling, token ids out
  residency.py    which conversation holds which sequence and its cells; who stays, who is saved
  slot.py         one sequence of the shared KV memory and the request it serves
  kv_pool.py      the KV cells accounted for, as llama.cpp's cache holds them (one pool or
                  a stream each)
  budget.py       where an answer's reasoning is, token by token (reasoning budgets)
  text_stream.py  token bytes turned into text safe to send
  throughput.py   a lane's figures: totals, tokens per second, mean request time
"""
