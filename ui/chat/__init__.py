"""The conversation in the centre: the page that sends, streams and edits (chat_page.py),
the rendered messages (chat_view.py), the composer (composer.py) and the welcome with
its suggestions (welcome.py)."""
