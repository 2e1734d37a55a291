"""A loaded model: the host (host.py) that loads by plan (loader.py, with the crash
journal and out-of-memory back-off) and holds the model, its drafts and its prompt cache
(prompt_cache.py); and the embedding model beside it (embeddings.py)."""
