"""The models on disk: the store of installed GGUF files (models.py), their metadata and
shapes read without loading them (gguf_file.py), chat formats (chat_format.py), draft
pairing (drafts.py), file fingerprints (fingerprint.py), and the BERT converter for the
starter embedding model (bert_gguf.py). No llama.cpp here."""
