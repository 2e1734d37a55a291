"""OpenAI's audio API: /v1/audio/transcriptions and /v1/audio/translations (a recording in,
text out, as json, text, srt, vtt or verbose_json with segments and words), and
/v1/audio/speech (text in, speech out as wav, pcm, flac, mp3, opus or aac; wav and pcm
streamed sentence by sentence as they are made). A recording is decoded in a child with
limits (engine/voice/decoding.py); a bad one is a 400 naming the part."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from ...engine import Engine
from ...errors import InvalidRequest
from ...voice.decoding import MAX_BYTES, decode
from ...voice.encoding import FORMATS, STREAMED, encoded, streamed
from ...voice.transcriber import Transcript
from ..side_work import off_loop
from ..wire import device_of

TEXT_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


class SpeechRequest(BaseModel):
    model: str = Field("tts-1", max_length=200)
    input: str = Field(max_length=4096)
    voice: str = Field("alloy", max_length=40)
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus", "aac"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(None, max_length=4096)  # accepted; eSpeak has no styles


async def _saved(upload: UploadFile) -> Path:
    """The upload in a private file of its own, its size bounded."""
    fd, name = tempfile.mkstemp(prefix="homerack-audio-")
    written = 0
    with os.fdopen(fd, "wb") as out:
        while chunk := await upload.read(1 << 20):
            written += len(chunk)
            if written > MAX_BYTES:
                os.unlink(name)
                raise InvalidRequest(f"file: over {MAX_BYTES >> 20} MiB", param="file")
            out.write(chunk)
    if not written:
        os.unlink(name)
        raise InvalidRequest("file: it is empty", param="file")
    return Path(name)


def _clock(seconds: float, comma: bool) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if comma else '.'}{ms:03d}"


def _answer(got: Transcript, fmt: str, task: str, granularities: list[str]):
    if fmt == "text":
        return PlainTextResponse(got.text + "\n")
    if fmt == "srt":
        return PlainTextResponse("\n".join(
            f"{i}\n{_clock(s.start, True)} --> {_clock(s.end, True)}\n{s.text}\n"
            for i, s in enumerate(got.segments, 1)))
    if fmt == "vtt":
        return PlainTextResponse("WEBVTT\n\n" + "\n".join(
            f"{_clock(s.start, False)} --> {_clock(s.end, False)}\n{s.text}\n"
            for s in got.segments))
    if fmt == "json":
        return {"text": got.text}
    out = {"task": task, "language": got.language, "duration": got.duration, "text": got.text}
    if "segment" in granularities or not granularities:
        out["segments"] = [{"id": i, "seek": s.seek, "start": s.start, "end": s.end,
                            "text": s.text, "tokens": list(s.tokens), "temperature": 0.0,
                            "avg_logprob": s.avg_logprob,
                            "compression_ratio": s.compression_ratio,
                            "no_speech_prob": s.no_speech_prob}
                           for i, s in enumerate(got.segments)]
    if "word" in granularities:
        out["words"] = [{"word": w, "start": a, "end": b}
                        for s in got.segments for a, b, w in s.words]
    return out


def router(engine: Engine) -> APIRouter:
    api = APIRouter()

    async def heard(http: Request, file: UploadFile, model: str | None, fmt: str,
                    language: str | None, prompt: str | None, temperature: float,
                    granularities: list[str], translate: bool):
        if fmt not in TEXT_FORMATS:
            raise InvalidRequest(f"response_format: one of {', '.join(TEXT_FORMATS)}",
                                 param="response_format")
        if not 0.0 <= temperature <= 1.0:
            raise InvalidRequest("temperature: from 0 to 1", param="temperature")
        if any(g not in ("word", "segment") for g in granularities):
            raise InvalidRequest("timestamp_granularities: word or segment",
                                 param="timestamp_granularities")
        model_of = engine.voice.transcription_model(model)
        with engine.home.working(device_of(http), None) as charge:
            path = await _saved(file)
            try:
                samples = await off_loop("decoding", decode, path)
            finally:
                path.unlink(missing_ok=True)
            got = await off_loop("hearing", model_of.transcribe, samples, language or None,
                                 prompt, translate, "word" in granularities, temperature)
            charge.tokens = sum(len(s.tokens) for s in got.segments)
        return _answer(got, fmt, "translate" if translate else "transcribe", granularities)

    @api.post("/v1/audio/transcriptions")
    async def transcriptions(http: Request, file: UploadFile = File(...),
                             model: str | None = Form(None),
                             language: str | None = Form(None), prompt: str | None = Form(None),
                             response_format: str = Form("json"),
                             temperature: float = Form(0.0),
                             timestamp_granularities: list[str] = Form(
                                 [], alias="timestamp_granularities[]")):
        return await heard(http, file, model, response_format, language, prompt, temperature,
                           timestamp_granularities, translate=False)

    @api.post("/v1/audio/translations")
    async def translations(http: Request, file: UploadFile = File(...),
                           model: str | None = Form(None),
                           prompt: str | None = Form(None), response_format: str = Form("json"),
                           temperature: float = Form(0.0)):
        return await heard(http, file, model, response_format, None, prompt, temperature, [],
                           translate=True)

    @api.post("/v1/audio/speech")
    async def speech(body: SpeechRequest, http: Request):
        voice = engine.voice.speech_model(body.model, body.voice)
        pieces = voice.sentences(body.input, body.voice, body.speed)
        metered = engine.home.working(device_of(http), None)
        charge = metered.__enter__()  # left when the last sentence is out
        charge.tokens = len(body.input) // 4  # about a token every four characters
        streaming = False
        try:
            # a bad voice or input fails here: 400; a synthesizer that died, a 500
            first = await off_loop("speech", next, pieces, None)
            if first is None:
                raise InvalidRequest("input: nothing to say", param="input")
            fmt = body.response_format
            if fmt not in STREAMED:
                rest = await off_loop("speech", list, pieces)
                data = await asyncio.to_thread(encoded, [first, *rest], voice.rate, fmt)
                return Response(data, media_type=FORMATS[fmt])
            streaming = True
            return StreamingResponse(_sentences(first, pieces, voice.rate, fmt, metered),
                                     media_type=FORMATS[fmt])
        finally:
            if not streaming:
                metered.__exit__(None, None, None)

    return api


async def _sentences(first: bytes, pieces, rate: int, fmt: str, metered):
    """A streamed answer's sentences as they are made; the device's request ends with it."""
    try:
        piece = next(iter(streamed([first], rate, fmt)))
        while piece is not None:
            yield piece
            # one turn of the loop first, so the piece leaves for the socket before the
            # next sentence's synthesis takes the CPU (3.6 ms to the first sound against
            # 5.2 on 2 cores)
            await asyncio.sleep(0)
            piece = await off_loop("speech", next, pieces, None)
    finally:
        metered.__exit__(None, None, None)
