"""The models on disk, read without loading them. No llama.cpp here.

  models.py              the models folder, the offline starters, user-added files
  local_model.py         a model on this machine as the catalog lists it (LocalModel)
  other_apps.py          the models other apps keep (Ollama, LM Studio, the Hub's cache,
                         llama.cpp, Jan, GPT4All), found in their folders' layouts
  other_models.py        OtherAppsModels: those models used in place, listed once beside
                         the folder's, the sources chosen
  watch.py               the folders watched: files that come and go found in seconds
  shelf.py               what the routes read of the models on disk (Engine.shelf)
  gguf_file.py           GGUF files validated, their metadata read with `gguf`
  gguf_bounds.py         a GGUF header's counts checked against its bytes before `gguf`
                         reads it (a crafted header loops or takes gigabytes there)
  shape.py               a model's shape as the planner needs it, from its header
  chat_format.py         the model's own chat template, rendered
  template_budget.py     a template's render bounded in steps, time and size
  template_polyfills.py  what a template lacks, supplied as llama.cpp's engine does
  sampling_defaults.py   each model's own sampling defaults
  facts.py               what a header says, as /v1/models lists it
  adapters.py            LoRA adapters: what a file holds and which models it fits
  projectors.py          vision projectors: which model each belongs to, what it costs
  drafts.py              draft models: which pairs fit, which draft to pick
  fingerprint.py         a file's identity, cheap to take, what caches key on
  bert_gguf.py           BERT sentence encoders written as GGUF (the starter embedder)
"""
