"""The engine's HTTP API: OpenAI's chat, completions, embeddings and Responses routes and
Anthropic's Messages, over the generation loop (app.py puts them together)."""

from .factory import create_app, error_body

__all__ = ["create_app", "error_body"]
