"""Tools from MCP servers: `config.py` (the user's mcp.json in the mcpServers notation,
imports from other apps, secrets in the keyring), `approvals.py` (allow, ask or deny per
tool, bound to the server's identity), `servers.py` (the servers started on demand on a
loop of their own, stopped when idle, started again when they died, with every wait
limited), `calls.py` (a result as the model reads it, cut to what its context holds, and
the log of every call), `toolbox.py` (what the engine offers of all that: the routes'
`engine.tools`, with the policy checked before every call), `builtin.py` (the tools the
engine serves itself: `search_documents`). No llama.cpp."""
