"""The conversation in the centre: the page that sends, streams and edits (chat_page.py),
the rendered messages (chat_view.py), the composer (composer.py), the welcome with its
suggestions (welcome.py), the Tools button (tools_menu.py: the MCP servers a chat is
offered) and the card that asks before a tool runs (approval_card.py)."""
