"""The engine's HTTP API: OpenAI's chat, completions, embeddings and Responses routes and
Anthropic's Messages, the engine's own and the Hub's, over the engine (factory.py puts them
together; server.py serves them)."""

from .factory import create_app

__all__ = ["create_app"]
