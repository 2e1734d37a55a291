"""llama.cpp through llama-cpp-python's low-level API: the backend and its measured log
(backend.py), a loaded context (runtime.py), the tokenizer (vocab.py), token sampling
(sampler.py), requantizing files (quantize.py), and the crash tests' fault injection
(faults.py). The only room that calls
the binding for generation; nothing here imports the rooms above it."""
