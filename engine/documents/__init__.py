"""The user's documents, indexed to be searched: `reading.py` (a file as lines that keep
their page, line and heading: text, Markdown, code, HTML, DOCX, and PDFs through
`pdf_pages.py`, in a child process with limits), `chunking.py` (lines into passages sized
by the embedder's own tokenizer), `index.py` (SQLite: collections, files, passages with
FTS5 and their vectors), `collections.py` (the worker that indexes in the background and
resumes after a restart, and hybrid search fused by reciprocal rank), `library.py` (the
collections as the engine keeps them: opened on first use, embedded by the engine's
models, closed with it). No llama.cpp: the engine gives it its embedder."""
