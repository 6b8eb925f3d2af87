"""A sentence-transformers folder's own files, read as data: modules.json, the Pooling module's
config, config_sentence_transformers.json (prompts) and sentence_bert_config.json.

They carry what the plain HF config lacks: which pooling, whether the vector is L2-normalized,
the max sequence length and lowercasing, the named prompts (E5's "query: " / "passage: ") and
whether prompt tokens take part in pooling. Both spellings are read: the legacy one
(`sentence_transformers.models.Pooling`, `pooling_mode_cls_token: true`) and the one
sentence-transformers >= 5 writes (`...modules.pooling.Pooling`, `pooling_mode: "cls"`); a mode
we do not implement is refused by name, never replaced by another.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_xdna.models.hf import field_error, read_json

# sentence-transformers' Pooling modes we implement (kernels/blocks/encoder.py EncoderPoolDesign)
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean",
                "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean",
                "pooling_mode_lasttoken": "lasttoken"}


@dataclass(frozen=True)
class SentenceConfig:
    """What sentence-transformers would do around the transformer, as plain data."""

    pooling: str = "mean"
    normalize: bool = True               # plain HF dir: the common sentence-embedding recipe
    include_prompt: bool = True          # False: prompt tokens are left out of the pooling
    prompts: tuple[tuple[str, str], ...] = ()     # (name, prefix text) pairs
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    do_lower_case: bool = False


def _json(path: Path) -> Any:
    return read_json(path) if path.is_file() else None


def _modules(root: Path) -> list[dict]:
    mods = _json(root / "modules.json")
    return [m for m in mods if isinstance(m, dict)] if isinstance(mods, list) else []


def _is(module: dict, cls: str) -> bool:
    # legacy "sentence_transformers.models.Pooling", current "...modules.pooling.Pooling"
    return str(module.get("type", "")).rsplit(".", 1)[-1] == cls


def transformer_dir(model_dir: str | Path) -> Path:
    """The folder holding config.json: the root, or the Transformer module's path in modules.json."""
    root = Path(model_dir)
    for m in _modules(root):
        if _is(m, "Transformer") and m.get("path"):
            sub = root / str(m["path"])
            if (sub / "config.json").is_file():
                return sub
    return root


def pooling_mode(cfg: dict, path: Path) -> str:
    """The one pooling mode of a Pooling config (either spelling); several or unknown: refused."""
    mode = cfg.get("pooling_mode")
    if mode is None:
        active = [m for k, m in _LEGACY_KEYS.items() if cfg.get(k)]
        mode = active if active else ["mean"]
    modes = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else None
    if not modes or len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise field_error(path, "pooling_mode", mode if mode is not None else cfg,
                          f"one of {', '.join(POOLING_MODES)} (one mode; concatenated modes "
                          "are not supported)")
    return modes[0]


def read_sentence_config(model_dir: str | Path) -> SentenceConfig:
    """The sentence-transformers settings of a folder (defaults for a plain HF directory)."""
    root = Path(model_dir)
    mods = _modules(root)
    pool_path = next((root / str(m.get("path", "")) / "config.json" for m in mods
                      if _is(m, "Pooling")), root / "1_Pooling" / "config.json")
    pool = _json(pool_path) or {}
    if not isinstance(pool, dict):
        raise field_error(pool_path, "(top level)", None, "a JSON object", shown=type(pool).__name__)
    st = _json(root / "sentence_bert_config.json") or {}
    extra = _json(root / "config_sentence_transformers.json") or {}
    prompts = extra.get("prompts") or {} if isinstance(extra, dict) else {}
    path = root / "config_sentence_transformers.json"
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise field_error(path, "prompts", prompts, "an object of prompt name -> prefix text")
    default = extra.get("default_prompt_name") if isinstance(extra, dict) else None
    if default is not None and default not in prompts:
        raise field_error(path, "default_prompt_name", default,
                          f"one of the prompts ({', '.join(prompts) or 'none defined'})")
    max_len = st.get("max_seq_length") if isinstance(st, dict) else None
    return SentenceConfig(
        pooling=pooling_mode(pool, pool_path) if pool else "mean",
        normalize=any(_is(m, "Normalize") for m in mods) if mods else True,
        include_prompt=bool(pool.get("include_prompt", True)),
        prompts=tuple(sorted((str(k), v) for k, v in prompts.items())), default_prompt_name=default,
        max_seq_length=int(max_len) if isinstance(max_len, int) and max_len > 0 else None,
        do_lower_case=bool(st.get("do_lower_case", False)) if isinstance(st, dict) else False)


def prompt_text(cfg: SentenceConfig, prompt_name: str | None, prompt: str | None,
                where: str) -> str:
    """The prefix sentence-transformers' encode(prompt_name=, prompt=) would prepend: an explicit
    prompt wins, then the named one, then the folder's default prompt; '' for none."""
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else cfg.default_prompt_name
    if name is None:
        return ""
    table = dict(cfg.prompts)
    if name not in table:
        raise ValueError(f"{where}: no prompt named {name!r} (this model defines: "
                         f"{', '.join(table) or 'none'}); pass one of those")
    return table[name]
