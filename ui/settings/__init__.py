"""The Settings page (settings_page.py): the system prompt, sampling, speculation and the
routing pair; where models are found besides Homerack's folder, with the choice to open
Ollama's API without the token (sources_panel.py); and the Tools page (tools_panel.py):
MCP servers, their logs, imports from other apps, the decisions kept and revoked."""
