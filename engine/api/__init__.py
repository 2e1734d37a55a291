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
  wire.py               what the routes and the server share on the wire: the error
                        shapes, one server-sent event, the extension object, the
                        caller a turn serves
  side_work.py          the routes' work that is no chat turn (speech, hearing,
                        embeddings): threads of its own, a device's metered
  channel.py            events from the worker thread into a request's event loop

The server (server/, it imports the wings; its __init__ is its map): the apps put
together (factory.py, the one module that mounts routes), uvicorn and the listeners, the
guard, the error replies, the replicas' front door and the home's door.
"""

from .server.factory import create_app, create_ollama_app

__all__ = ["create_app", "create_ollama_app"]
