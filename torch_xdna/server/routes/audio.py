"""OpenAI audio routes: POST /v1/audio/transcriptions and /v1/audio/translations.

Multipart form as the OpenAI API takes it: file (required), model, language, prompt,
response_format (json | text | srt | vtt | verbose_json), temperature, timestamp_granularities[]
("segment"). The upload is capped by ServerConfig.max_audio_bytes (25 MB, OpenAI's limit) in the
server's guard; the audio is decoded and resampled off the device thread, so a corrupt or
unsupported file is answered 400 without waiting for the device; the Whisper model runs on the
device worker like every other model. "whisper-1" (what OpenAI clients send by default) names
the first Whisper model served.
"""
from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from torch_xdna.server.schemas import APIError
from torch_xdna.server.worker import Job

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature",
          "timestamp_granularities[]", "timestamp_granularities", "stream"}
OPENAI_DEFAULT_MODEL = "whisper-1"
MAX_PROMPT_CHARS = 4096


def _field(form, name: str) -> str | None:
    v = form.get(name)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise APIError(400, f"'{name}' must be a text field, not a file.", param=name,
                       code="invalid_value")
    return v


def _options(form, task: str):
    from torch_xdna.engine.asr.transcribe import TranscribeOptions
    unknown = sorted(set(form.keys()) - FIELDS)
    if unknown:
        raise APIError(400, f"Unrecognized request argument supplied: {unknown[0]}",
                       param=unknown[0], code="unknown_parameter")
    fmt = _field(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise APIError(400, f"'response_format' is {fmt!r}; use one of {', '.join(FORMATS)}.",
                       param="response_format", code="invalid_value")
    if (_field(form, "stream") or "false").lower() not in ("false", "0"):
        raise APIError(400, "'stream' is not supported for audio; omit it.", param="stream",
                       code="invalid_value")
    raw = _field(form, "temperature")
    try:
        temperature = float(raw) if raw is not None else 0.0
    except ValueError:
        temperature = math.nan
    if not 0.0 <= temperature <= 1.0:
        raise APIError(400, f"'temperature' must be a number between 0 and 1, got {raw!r}.",
                       param="temperature", code="invalid_value")
    grans = [g for g in form.getlist("timestamp_granularities[]")
             + form.getlist("timestamp_granularities") if isinstance(g, str)]
    if "word" in grans:
        raise APIError(400, "word timestamps are not supported; use "
                            "timestamp_granularities[]=segment.",
                       param="timestamp_granularities", code="invalid_value")
    prompt = _field(form, "prompt")
    if prompt and len(prompt) > MAX_PROMPT_CHARS:
        raise APIError(400, f"'prompt' has {len(prompt)} characters; at most "
                            f"{MAX_PROMPT_CHARS}.", param="prompt", code="invalid_value")
    language = _field(form, "language") if task == "transcribe" else None
    return fmt, TranscribeOptions(language=language, task=task, temperature=temperature,
                                  timestamps=fmt in ("srt", "vtt", "verbose_json") or bool(grans),
                                  prompt=prompt)


def register(app: FastAPI, srv) -> None:
    """Add the audio routes to `app` (listed in server/app.py's ROUTE_MODULES)."""

    def resolve(model_id: str | None):
        try:
            return srv.registry.resolve(model_id, "asr")
        except APIError as e:
            if e.status == 404 and model_id == OPENAI_DEFAULT_MODEL:
                return srv.registry.resolve(None, "asr")
            raise

    async def handle(request: Request, task: str):
        from torch_xdna.engine.asr.audio import AudioError, load_audio
        ctype = request.headers.get("content-type", "")
        if not ctype.startswith("multipart/form-data"):
            raise APIError(400, "Send the audio as multipart/form-data with a 'file' field "
                                "(as the OpenAI API does).", code="invalid_content_type")
        try:
            form = await request.form()
        except Exception:                           # malformed multipart body
            raise APIError(400, "The multipart body could not be parsed: check its boundary and "
                                "parts (send it as an HTTP client's multipart upload does).",
                           code="invalid_multipart") from None
        try:
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise APIError(400, "Missing required parameter: 'file' (the audio file).",
                               param="file", code="missing_required_parameter")
            fmt, opts = _options(form, task)
            entry = resolve(_field(form, "model"))
            data = await upload.read()
            name = upload.filename or "audio"
        finally:
            await form.close()
        try:
            samples = await run_in_threadpool(load_audio, data, 16000, name)
        except AudioError as e:
            raise APIError(400, str(e), param="file", code="invalid_audio") from None

        def run():
            model = srv.load(entry)
            try:
                return model.transcribe(samples, opts, name=name)
            except ValueError as e:               # unknown language, bad prompt...
                raise APIError(400, str(e), code="invalid_value") from None

        result = await srv.wait(srv.submit(Job(fn=srv.npu_job(run))), request)
        from torch_xdna.engine.asr.subtitles import render, verbose
        headers = {"x-xdna-backend": srv.dev.backend,
                   "x-xdna-modeled-npu-ms": f"{result.stats.modeled_total_ms:.3f}"}
        srv.metrics.add_tokens(entry.id, "completion", result.stats.tokens)
        if fmt == "json":
            return JSONResponse({"text": result.text}, headers=headers)
        if fmt == "verbose_json":
            return JSONResponse(verbose(result), headers=headers)
        media = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}[fmt]
        return PlainTextResponse(render(result, fmt), media_type=media, headers=headers)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await handle(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await handle(request, "translate")
