"""Composition, Qt-free: the command line (cli/), where things live, the engine's
process, and what the window keeps (its own UI lives in ui/).

  paths.py         where Homerack keeps things, per platform
  settings.py      the app's settings files (sampling, the routing pair)
  chat_state.py    what the window shows and sends with, as one frozen value
  history.py       conversations and their messages, in SQLite
  session.py       the replies being generated, several conversations at once
  transcripts.py   conversations out as Markdown or JSON, and back in
  attachments.py   files attached to a message, read to text
  tool_rounds.py   a reply with tools: calls approved, run in the engine, results back
  tool_config.py   the user's MCP servers (mcp.json), imports from other apps
  client.py        a small client of the engine API
  engine_proc.py   finding, starting and stopping this user's engine
  supervisor.py    an engine kept available to the window
  local_models.py  the models folder as the app and the CLI reach it
  cluster.py       the cluster composed for `serve --workers`
  workers.py       pairing with a worker and sharing this machine as one, from the UI's
                   process, without llama.cpp
  self_test.py     `homerack self-test`
  desktop.py       the desktop entry and icon
  qt_check.py      whether Qt's X11 plugin can load here
  __main__.py      `python -m app`
"""
