"""The engine's HTTP API over `Engine` (routes go through its methods and the services its
docstring names; a contract says so). Three wings, independent of each other (a
contract), over a floor they share, under the server that assembles them:

  wire_formats/   each app's way of asking: OpenAI's, Anthropic's, the Responses API,
                  embeddings, audio, Ollama's
  admin/          the owner's routes: models, the Hub, tools, documents, the home
  home/           what the home's paired devices reach: pairing, the web chat, their
                  conversations

The floor (the wings import it, it imports no wing):

  turns.py              one generation as the routes see it (a conversation rendered,
                        grounded, read back in its family's format)
  grounding.py          a conversation's `collections` (every wire format), passages in,
                        citations out
  schemas.py            request bodies (pydantic names bad fields), and the conversation
                        an OpenAI chat body is
  thinking.py           a request's reasoning settings, as each API states them
  wire.py               what the routes share on the wire
  side_work.py          the routes' work that is no chat turn (speech, hearing,
                        embeddings): threads of its own, a device's metered
  channel.py            events from the worker thread into a request's event loop

The server (it imports the wings):

  factory.py            the owner's app put together: routes, the token, guard
  error_replies.py      errors answered in each wire's shape (every app's)
  server.py             uvicorn on a socket bound here; listeners.py: sockets, the
                        servers beside the main one on its event loop, and the sharing
                        listener's caps (connections, slow requests)
  guard.py              Host, body size and route checked before FastAPI reads a request
  front_door.py         the replicas' gateway: a request answered here or on a paired machine
  home_door.py          the sharing listener for the home's paired devices: its gate (a
                        device's key, only generation, no cross-site change), a strict CSP,
                        opened and closed while the engine runs, announced by mDNS
"""

from .factory import create_app, create_ollama_app

__all__ = ["create_app", "create_ollama_app"]
