"""What a model's answer holds once read in its family's format."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object; a partial call's is a prefix of the final one
    id: str | None = None  # the model's own id for the call (Mistral, Kimi), if it wrote one


@dataclass(frozen=True)
class Parsed:
    content: str = ""
    reasoning: str = ""
    calls: tuple[ParsedCall, ...] = ()


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str  # a piece of the arguments' JSON text
