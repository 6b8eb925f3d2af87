"""Reading Hugging Face model directories: config.json and safetensors (single or sharded).

No network: a directory on disk is the only source. Errors name the file and what is missing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch


class ModelDirError(ValueError):
    """A model directory is missing a file or holds a malformed one."""


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelDirError(f"{model_dir}: no config.json; pass a Hugging Face model directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelDirError(f"{path}: not valid JSON ({e})") from None


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a directory, following model.safetensors.index.json when sharded."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelDirError(f"{index}: malformed shard index ({e})") from None
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
