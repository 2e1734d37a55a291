"""Models from the Hugging Face Hub: search, quants and their verdicts on this machine,
verified downloads (repos.py), and the background downloads the app watches
(downloads.py)."""
