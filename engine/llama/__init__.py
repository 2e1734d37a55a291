"""llama.cpp, through llama-cpp-python's low-level API and ctypes: the only room that
loads it (contracts keep the planner, the conversation and the routes off it).

  native.py    the native libraries: the best build for this CPU, found and loaded
  cuda_runtime.py  NVIDIA's runtime for the packaged app's CUDA module, fetched once
  backend.py   the backend, started once, and its log (where loads are measured)
  probe.py     the devices as llama.cpp sees them (ctypes on ggml's registry)
  rpc.py       llama.cpp's RPC server and client devices, for workers
  runtime.py   a loaded model and its context
  held.py      what each sequence's KV cells hold, token by token (the guard's truth)
  vision.py    a vision projector on libmtmd: images into a sequence
  vocab.py     a model's tokenizer, with or without its weights
  sampler.py   the next token: sampler chains, greedy argmax, grammars
  grammar.py   JSON Schema -> GBNF with the binding's converter
  lora.py      LoRA adapters loaded once, switched per evaluation
  quantize.py  requantizing a model file
  faults.py    fault injection for the crash-journal tests
"""
