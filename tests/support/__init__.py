"""Helpers the tests share (conftest.py holds the fixtures only): the models they run
(models.py), driving engines in-process and as processes (engines.py), a local
Hugging Face Hub (hub_server.py), chat templates with tools (agent_templates.py)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
