"""The engine's HTTP API over `Engine` (routes go through its methods and its `shelf` of
models on disk; a contract says so):

  factory.py            the owner's app put together: routes, the token, guard
  error_replies.py      errors answered in each wire's shape (every app's)
  server.py             uvicorn on a socket bound here; listeners.py: sockets, and the
                        servers beside the main one on its event loop
  guard.py              Host, body size and route checked before FastAPI reads a request
  front_door.py         the replicas' gateway: a request answered here or on a paired machine
  openai_routes.py      OpenAI's chat completions and completions
  anthropic_routes.py   Anthropic's Messages
  responses_routes.py   OpenAI's Responses; mcp_responses.py: its `mcp` tool (servers
                        listed, calls run or approval asked, rounds until the answer)
  embeddings_routes.py  OpenAI's embeddings
  audio_routes.py       OpenAI's audio: transcriptions, translations, speech (engine/voice)
  ollama_routes.py      Ollama's API (tags, show, ps, chat, generate, embed), for the apps
                        that speak it; ollama_schemas.py: its request bodies
  admin_routes.py       the engine's own: models, loading, plans, routing, health, metrics
  hub_routes.py         the Hub: search, quants and verdicts, cards, downloads
  tool_routes.py        MCP: the servers, their tools and policies, an approved call,
                        the user's decisions, the log of calls
  document_routes.py    document collections: added, listed with progress, searched;
                        grounding.py: a conversation's `collections` (every wire format), passages in, citations out
  home_door.py          the sharing listener for the home's paired devices: its gate (a
                        device's key, only generation, no cross-site change), a strict CSP,
                        opened and closed while the engine runs, announced by mDNS
  home_routes.py        what a device reaches there besides generation: pairing, the web
                        chat's page (web/) and its own conversations, replies that outlive
                        the page; home_admin_routes.py: the owner's side (sharing on or
                        off, codes, devices, limits, who waits)
  turns.py              one generation as the routes see it
  thinking.py           a request's reasoning settings, as each API states them
  schemas.py            request bodies (pydantic names bad fields)
  wire.py               what the routes share on the wire
  channel.py            events from the worker thread into a request's event loop
"""

from .factory import create_app, create_ollama_app

__all__ = ["create_app", "create_ollama_app"]
