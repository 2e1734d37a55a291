"""The API's server: what assembles the wings into apps and serves them. It imports the
wings; only factory.py mounts their routes (a contract keeps the rest apart from the
wire formats: they speak the floor's wire.py).

  factory.py        the apps put together: the owner's (routes, the token, the guard,
                    /health), Ollama's alone, and the one the home's devices reach
  serving.py        uvicorn on a socket bound here, the Ollama port beside it
  listeners.py      sockets, the servers beside the main one on its event loop, and the
                    sharing listener's caps (connections, slow requests, unread
                    answers, websocket upgrades)
  guard.py          Host, body size, text and route checked before FastAPI reads a request
  text_check.py     a JSON body's strings checked for lone surrogates (no Unicode text)
  origins.py        the Ollama door's Origin check (OLLAMA_ORIGINS) and its mark
  error_replies.py  every error answered in its wire's shape (the shapes: wire.py)
  front_door.py     the replicas' gateway: a request answered here or on a paired machine
  home_door.py      the sharing listener for the home's paired devices: its gate (a
                    device's key, only generation, no cross-site change), a strict CSP,
                    opened and closed while the engine runs, announced by mDNS
"""
