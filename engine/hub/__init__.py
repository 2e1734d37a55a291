"""Models from the Hugging Face Hub:

  repos.py              search, quants and their verdicts on this machine, downloads
  downloads.py          background downloads the app watches, verified, resumable
  generation_config.py  a downloaded model's sampling defaults from its repository
"""
