"""What `xdna serve` can set (ServerConfig) and how a --model argument reads."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch_xdna.server.http import HttpLimits


@dataclass
class ServerConfig:
    """Everything `xdna serve` can set. `models`: directories ("DIR" or "NAME=DIR")."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    models: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)     # "ALIAS=MODEL": more names of a model
    default_model: bool = True            # offer the bundled all-MiniLM-L6-v2
    max_queue: int = 64                   # waiting requests before 429
    gather_ms: float = 20.0               # embedding merge window when clients overlap (worker.py)
    host_threads: int | None = None       # sim host lanes (None: runtime/sim/lanes.default_host_lanes)
    max_models: int = 2                   # resident models (LRU)
    max_body_bytes: int = 4 << 20
    max_audio_bytes: int = 25 << 20       # /v1/audio/* uploads (OpenAI's 25 MB file limit)
    max_inputs: int = 2048                # inputs per embeddings request (OpenAI's limit)
    max_request_tokens: int = 65536       # tokens per embeddings request
    truncate: bool = False                # over-long embedding inputs: truncate instead of 400
    max_new_tokens: int = 2048            # completion tokens per request
    max_context: int | None = None        # chat models' KV capacity (None: from the memory budget)
    kv_dtype: str = "bf16"                # chat models' KV storage: bf16 | int8
    prefill_chunk: int | None = None      # chat models' prompt tokens per prefill launch
    precision: str = "native"             # chat models' weights (Whisper: auto, int8, fp32, else bf16)
    precision_budget: object = None       # --precision auto's budget: a precision_auto.Budget
    max_batch: int = 4                    # chats decoded together per step (1: no batching)
    request_timeout_s: float = 300.0
    preload: bool = True                  # make the first models resident at startup
    cors_origins: list[str] = field(default_factory=list)   # browser origins allowed (CORS)
    limits: HttpLimits = field(default_factory=HttpLimits)  # connections, timeouts, shutdown

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"




def parse_model_arg(spec: str) -> tuple[str | None, str]:
    """"DIR" or "NAME=DIR" -> (name or None, dir); an existing directory is never split, nor
    a ",tokenizer=DIR" suffix (server/registry.py)."""
    if "=" not in spec.split(",tokenizer=")[0] or Path(spec).expanduser().is_dir():
        return None, spec
    name, _, path = spec.partition("=")
    return name or None, path
