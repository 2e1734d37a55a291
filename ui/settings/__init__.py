"""The Settings page (settings_page.py): the system prompt, sampling, speculation and the
routing pair."""
