"""The conversation in the centre: the page that sends, streams and edits (chat_page.py),
the rendered messages (chat_view.py), the composer (composer.py), the welcome with its
suggestions (welcome.py), the Tools button (tools_menu.py: the MCP servers a chat is
offered), the card that asks before a tool runs (approval_card.py), the Documents
button (documents_menu.py: the collections a chat's answers are grounded in) and voice
(voice.py: Speak, Read aloud, Talk; sound_devices.py: the microphone and the speakers, or
their stand-ins; turn_taking.py: when a hands-free question has been said)."""
