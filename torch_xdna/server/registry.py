"""The models a server offers, and which of them are resident on the device (LRU-limited).

Offering a model is cheap (its config is read at startup, so a bad directory fails before the
server binds); making it resident uploads its weights. `get` runs only on the device worker thread,
so loading and evicting never race with a running program.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from torch_xdna.choices import DEFAULT_KV_DTYPE
from torch_xdna.models.encoder import (ENCODER_TYPES, EncoderSpec, EncoderTokenizer, load_spec,
                                       transformer_dir)
from torch_xdna.models.hf import ModelDirError, read_config
from torch_xdna.runtime.errors import DeviceOutOfMemory
from torch_xdna.server.schemas import APIError

KINDS = ("embedding", "chat", "rerank", "image", "asr")   # image: ViT/DINOv2/ResNet embedders
DEFAULT_EMBEDDING_ID = "all-MiniLM-L6-v2"


@dataclass(eq=False)
class ModelEntry:
    id: str
    kind: str                                  # one of KINDS
    factory: Callable[[], Any]                 # loads the resident model (worker thread)
    path: Path | None = None
    aliases: tuple[str, ...] = ()
    pinned: bool = False                       # given as an object: cannot be reloaded
    created: int = field(default_factory=lambda: int(time.time()))
    spec: EncoderSpec | None = None            # embedding models
    tokenizer: EncoderTokenizer | None = None


TOKENIZER_SUFFIX = ",tokenizer="


def split_tokenizer(spec: str | Path) -> tuple[str, str | None]:
    """"PATH,tokenizer=DIR" -> (PATH, DIR): a GGUF file served with the original tokenizer."""
    text = str(spec)
    if TOKENIZER_SUFFIX in text and not Path(text).expanduser().exists():
        path, _, tok = text.rpartition(TOKENIZER_SUFFIX)
        return path, tok or None
    return text, None


def load_failure(model_id: str, e: BaseException) -> str:
    """One line for an API client: which model failed to load, why (no server paths) and what
    the operator does about it."""
    if isinstance(e, ModelDirError):
        why = e.public_message
    elif isinstance(e, (ModuleNotFoundError, ValueError)) and str(e):
        why = getattr(e, "public_message", None) or str(e)
    else:
        why = f"{type(e).__name__} (the server log has the details)"
    why = " ".join(why.split()).rstrip(".")
    return (f"The model '{model_id}' could not be loaded: {why}. The server operator must fix "
            f"or replace the files given to `xdna serve --model`; other served models still work.")


def model_kind(model_dir: Path) -> str:
    """'rerank' for BERT-family cross-encoders (*ForSequenceClassification), 'embedding' for
    other BERT-family encoders (incl. sentence-transformers folders), 'image' for ViT/DINOv2/ResNet
    image encoders, 'asr' for Whisper (HF or CTranslate2 directories) and Parakeet, else 'chat'."""
    from torch_xdna.models.formats.ct2 import is_ct2_dir
    from torch_xdna.models.cross_encoder import is_cross_encoder
    from torch_xdna.models.vision import IMAGE_TYPES
    if is_ct2_dir(model_dir):
        return "asr"
    cfg = read_config(transformer_dir(model_dir))
    if cfg.get("model_type") == "whisper" or str(cfg.get("model_type")).startswith("parakeet"):
        return "asr"
    if cfg.get("model_type") in IMAGE_TYPES:
        return "image"
    if cfg.get("model_type") in ENCODER_TYPES:
        return "rerank" if is_cross_encoder(cfg) else "embedding"
    return "chat"


def check_gguf(path: Path, tokenizer_dir: str | None) -> None:
    """The quick startup check of a GGUF chat model: header and config, and the tokenizer it
    will use (rebuilt from the file's metadata, or the given directory's tokenizer.json)."""
    from torch_xdna.models.formats.gguf import gguf_tokenizer
    from torch_xdna.models.loader import read_model
    from torch_xdna.models.tokenizer import Tokenizer
    files = read_model(path)
    if tokenizer_dir is None:
        gguf_tokenizer(files.gguf)
    else:
        Tokenizer(Path(tokenizer_dir).expanduser())


class ModelRegistry:
    """max_context / kv_dtype: the chat models' KV cache (context limit, storage) unless add_dir
    names its own; None = the model's maximum within the memory budget (engine/llm/kv_cache.py).
    precision / budget: the chat models' weight precision (load_decoder's: native, auto, a
    mode); Whisper models take auto, int8 or fp32 from it, else bf16."""

    def __init__(self, max_models: int = 2, max_context: int | None = None,
                 kv_dtype: str = DEFAULT_KV_DTYPE, precision: str = "native", budget: Any = None,
                 prefill_chunk: int | None = None):
        if max_models < 1:
            raise ValueError(f"max_models must be >= 1 (got {max_models})")
        self.max_models = max_models
        self.max_context, self.kv_dtype = max_context, kv_dtype
        self.precision, self.budget = precision, budget
        self.prefill_chunk = prefill_chunk        # None: the engine's default
        self.entries: dict[str, ModelEntry] = {}
        self.loaded: OrderedDict[str, Any] = OrderedDict()
        self.loads = 0
        self.evictions = 0
        self._lock = threading.Lock()

    # --- offering -----------------------------------------------------------------------------
    def _unique(self, name: str) -> str:
        base, i = name, 2
        while name in self.entries or any(name in e.aliases for e in self.entries.values()):
            name = f"{base}-{i}"
            i += 1
        return name

    def add_dir(self, model_dir: str | Path, name: str | None = None,
                aliases: tuple[str, ...] = (), max_context: int | None = None,
                kv_dtype: str | None = None) -> ModelEntry:
        """Offer a HF directory, a GGUF file ("FILE.gguf,tokenizer=DIR" to use the original
        tokenizer), a CTranslate2 Whisper directory or a packaged checkpoint's name; the kind is
        detected from the files. Every file is checked here (config, GGUF header and tokenizer),
        so a bad one raises ModelDirError before the server binds."""
        from torch_xdna.models.formats.gguf import is_gguf
        from torch_xdna.models.packaged import resolve
        spec, tokenizer_dir = split_tokenizer(model_dir)
        path = resolve(spec)
        gguf_file = is_gguf(path)
        if not path.is_dir() and not gguf_file:
            raise ModelDirError(f"{spec}: not a directory or .gguf file; pass a Hugging Face "
                                "model directory, a llama.cpp GGUF file or a CTranslate2 Whisper "
                                "directory")
        if tokenizer_dir is not None and not gguf_file:
            raise ModelDirError(f"{model_dir}: ',tokenizer=DIR' is for GGUF files only; a model "
                                "directory's own tokenizer.json is used")
        if gguf_file:
            check_gguf(path, tokenizer_dir)   # a broken file fails before the server binds
        kind = "chat" if gguf_file else model_kind(path)
        if name is not None and self.find(name) is not None:
            raise ModelDirError(f"the model name {name!r} is given twice; give each --model its "
                                f"own NAME (NAME=DIR)")
        name = self._unique(name or (path.stem if gguf_file else path.resolve().name))
        if kind == "embedding":
            from torch_xdna.engine.embed.embedder import Embedder
            spec = load_spec(path, name=name)
            entry = ModelEntry(name, kind, lambda: Embedder.load(path, name=name), path, aliases,
                               spec=spec, tokenizer=EncoderTokenizer(path, spec))
        elif kind == "rerank":
            from torch_xdna.engine.embed.reranker import Reranker
            from torch_xdna.models.cross_encoder import PairTokenizer, load_head_spec
            spec = load_spec(path, name=name)
            if spec.arch is not None:
                raise ModelDirError(f"{path}: {spec.model_type} cross-encoders (reranking) are not "
                                    "supported; BERT / XLM-R ones are (serve its encoder for "
                                    "embeddings instead)")
            load_head_spec(path)                       # a bad head fails before the server binds
            entry = ModelEntry(name, kind, lambda: Reranker.load(path, name=name), path, aliases,
                               spec=spec, tokenizer=PairTokenizer(path, spec))
        elif kind == "image":
            from torch_xdna.engine.vision.image_embedder import ImageEmbedder
            entry = ModelEntry(name, kind, lambda: ImageEmbedder.load(path, name=name), path,
                               aliases)
        elif kind == "asr":
            from torch_xdna.engine.asr.load import check_asr_dir, load_transcriber
            check_asr_dir(path)                      # a bad directory fails before binding
            asr_prec = self.precision if self.precision in ("auto", "fp32", "int8") else "bf16"
            entry = ModelEntry(name, kind, lambda: load_transcriber(
                path, asr_prec, budget=self.budget, quiet=True), path, aliases)
        else:
            from torch_xdna.server.chat import load_chat_model
            ctx, kvd = max_context or self.max_context, kv_dtype or self.kv_dtype
            chunk = self.prefill_chunk
            entry = ModelEntry(name, kind, lambda: load_chat_model(
                path, ctx, kvd, tokenizer_dir, self.precision, self.budget, chunk), path, aliases)
        self.entries[name] = entry
        return entry

    def add_default_embedding(self) -> ModelEntry:
        from torch_xdna.engine.embed.embedder import default_model_dir
        return self.add_dir(default_model_dir(), DEFAULT_EMBEDDING_ID,
                            aliases=("sentence-transformers/all-MiniLM-L6-v2",))

    def add_object(self, model: Any, kind: str, name: str) -> ModelEntry:
        """Offer an already-built model (an Embedder or a ChatModel); it stays resident."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        name = self._unique(name)
        entry = ModelEntry(name, kind, lambda: model, pinned=True)
        if kind in ("embedding", "rerank"):
            entry.spec, entry.tokenizer = model.spec, model.tokenizer
        self.entries[name] = entry
        with self._lock:
            self.loaded[name] = model
        return entry

    def add_alias(self, alias: str, model_id: str) -> None:
        """Serve `model_id` under another name too (--alias text-embedding-3-small=MODEL)."""
        entry = self.find(model_id)
        if entry is None:
            raise ValueError(f"--alias {alias}={model_id}: no served model is called "
                             f"{model_id!r} (served: {', '.join(self.entries)})")
        if self.find(alias) is not None:
            raise ValueError(f"--alias {alias}={model_id}: the name {alias!r} is taken already")
        entry.aliases = (*entry.aliases, alias)

    def context_length(self, entry: ModelEntry) -> int | None:
        """The one context length reported for a chat model: the resident model's KV capacity
        (what requests are checked against), else what it will be at most (--max-context, the
        config's max_position_embeddings)."""
        model = self.loaded.get(entry.id)
        if model is not None and getattr(model, "context_length", None):
            return int(model.context_length)
        if entry.kind != "chat" or entry.path is None or not entry.path.is_dir():
            return None
        try:
            limit = int(read_config(entry.path).get("max_position_embeddings") or 0) or None
        except (ValueError, OSError, TypeError):
            limit = None
        caps = [c for c in (limit, self.max_context) if c]
        return min(caps) if caps else None

    # --- lookup -------------------------------------------------------------------------------
    def find(self, name: str) -> ModelEntry | None:
        """The entry called `name` (its id or an alias), else None."""
        return self.entries.get(name) or next(
            (e for e in self.entries.values() if name in e.aliases), None)

    def resolve(self, model_id: str | None, kind: str | tuple[str, ...]) -> ModelEntry:
        """The entry a request names (or the first of `kind` when it names none); `kind` may be
        a tuple of accepted kinds (/v1/embeddings takes text and image embedders)."""
        kinds = (kind,) if isinstance(kind, str) else kind
        kind = kinds[0]
        if model_id is None:
            for e in self.entries.values():
                if e.kind in kinds:
                    return e
            raise APIError(400, f"no {kind} model is being served; start the server with "
                                f"--model DIR", param="model", code="model_not_found")
        entry = self.find(model_id)
        if entry is None:
            raise APIError(404, f"The model '{model_id}' does not exist or you do not have access "
                                f"to it. Served models: {', '.join(self.entries)}",
                           param="model", code="model_not_found")
        if entry.kind not in kinds:
            route = {"embedding": "/v1/embeddings", "image": "/v1/embeddings",
                     "rerank": "/v1/rerank",
                     "asr": "/v1/audio/transcriptions"}.get(entry.kind, "/v1/chat/completions")
            article = "an" if entry.kind[0] in "aeiou" else "a"
            raise APIError(400, f"model '{entry.id}' is {article} {entry.kind} model; use {route}",
                           param="model", code="model_not_supported")
        return entry

    def loaded_ids(self) -> list[str]:
        with self._lock:
            return list(self.loaded)

    # --- residency (device worker thread only) --------------------------------------------------
    def get(self, entry: ModelEntry) -> Any:
        with self._lock:
            model = self.loaded.get(entry.id)
            if model is not None:
                self.loaded.move_to_end(entry.id)
                return model
        # Load first, evict after: a model that fails to load (bad directory, corrupt weights)
        # must not cost a healthy resident model its place. Only when the device is out of
        # memory is the least recently used model unloaded to make room, and the load retried.
        while True:
            try:
                model = entry.factory()
                break
            except DeviceOutOfMemory:
                if not self._evict_one():
                    raise
        self.loads += 1
        with self._lock:
            self.loaded[entry.id] = model
        while len(self.loaded) > self.max_models and self._evict_one(keep=entry.id):
            pass
        return model

    def unload(self, entry_id: str) -> bool:
        """Unload one resident model now (device worker thread); False if it is not resident
        or pinned (Ollama's keep_alive)."""
        with self._lock:
            if entry_id not in self.loaded or self.entries[entry_id].pinned:
                return False
            model = self.loaded.pop(entry_id)
        _close(model)
        return True

    def _evict_one(self, keep: str | None = None) -> bool:
        """Unload the least recently used unpinned model (never `keep`); False if none."""
        with self._lock:
            victim = next((k for k in self.loaded
                           if k != keep and not self.entries[k].pinned), None)
            if victim is None:
                return False                          # only pinned models: allow one over
            model = self.loaded.pop(victim)
        self.evictions += 1
        _close(model)
        return True

    def close_all(self) -> None:
        with self._lock:
            models = [m for k, m in self.loaded.items() if not self.entries[k].pinned]
            self.loaded.clear()
        for m in models:
            _close(m)


def _close(model: Any) -> None:
    close = getattr(model, "close", None)
    if close:
        close()
