"""Reading Hugging Face model directories: config.json and safetensors (single or sharded).

No network: a directory on disk is the only source. Errors name the file and what is missing.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import torch

from torch_xdna.runtime.cachedir import loads_bounded

MAX_JSON_BYTES = 64 << 20          # config/tokenizer_config files are KBs; tokenizer.json is separate
_PATH = re.compile(r"(?<![\w.])(?:/[^\s/:'\"]+)+/?")


def scrub_paths(text: str) -> str:
    """`text` with every absolute path replaced by its last component (no server layout leaks)."""
    return _PATH.sub(lambda m: Path(m.group(0)).name or "/", text)


class ModelDirError(ValueError):
    """A model directory is missing a file or holds a malformed one.

    str(e) is the full message for the CLI and logs (it names the file by path);
    `public_message` is the same without server paths, for API clients."""

    def __init__(self, message: str, *, public: str | None = None):
        super().__init__(message)
        self._public = public

    @property
    def public_message(self) -> str:
        return self._public if self._public is not None else scrub_paths(str(self))


def _short(value: Any) -> str:
    """A field value as the user wrote it (JSON spelling; strings quoted), cut to 80 chars."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def field_error(path: Path, field: str, value: Any, expected: str, *,
                shown: str | None = None) -> ModelDirError:
    """'<file>: field <f> is <value>; expected <what>' (public form: the file name only).
    `shown` describes the value instead of quoting it (a missing field, a long template)."""
    tail = f"field {field!r} is {shown if shown is not None else _short(value)}; expected {expected}"
    return ModelDirError(f"{path}: {tail}", public=f"{Path(path).name}: {tail}")


def read_json(path: Path) -> Any:
    """A JSON file of a model directory, size- and depth-bounded; errors name the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ModelDirError(f"{path}: {size} bytes, over the {MAX_JSON_BYTES}-byte bound",
                                public=f"{path.name}: file too large")
        return loads_bounded(path.read_bytes())
    except ModelDirError:
        raise
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise ModelDirError(f"{path}: not valid JSON ({e})",
                            public=f"{path.name}: not valid JSON ({scrub_paths(str(e))})") from None


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelDirError(f"{model_dir}: no config.json; pass a Hugging Face model directory")
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise field_error(path, "(top level)", None, "a JSON object", shown=type(cfg).__name__)
    return cfg


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a directory, following model.safetensors.index.json when sharded."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        doc = read_json(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(f, str) and f and "/" not in f and f not in (".", "..")
                for f in weight_map.values()):
            raise field_error(index, "weight_map", weight_map, "an object of tensor name -> shard "
                              "file name in this directory")
        files = sorted({d / f for f in weight_map.values()})
    else:
        files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelDirError(f"{model_dir}: no *.safetensors weights found")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ModelDirError(f"{model_dir}: shard index names missing files: {', '.join(missing)}")
    return files


def iter_tensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, CPU tensor) for every weight, one shard at a time."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open
    for f in safetensors_files(model_dir):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    yield name, fh.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise ModelDirError(f"{f}: unreadable safetensors file ({e})") from None


def load_state_dict(model_dir: str | Path) -> dict[str, torch.Tensor]:
    return dict(iter_tensors(model_dir))
