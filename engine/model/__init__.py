"""A loaded model and what comes with it, driven from its lane's worker thread:

  host.py          loads by plan and holds the loaded model; measures it against the plan
  loader.py        loading with the crash journal and the out-of-memory back-off
  loaded.py        the loaded model (format, turn ends, caches) and its prompt's tokens
  drafts.py        the drafters that speculate for it, and their controllers
  adapters.py      its LoRA adapters, loaded on first use
  prompt_cache.py  prompts' KV states kept in RAM and on disk
  embeddings.py    the embedding model beside it, and a reranker
  vision.py        its projector, loaded by the plan, and the image embeddings it keeps
  vocabularies.py  tokenizers without weights, for counting prompts
"""
