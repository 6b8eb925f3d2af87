"""On-disk compile cache: graph -> lowered plan (partition assignment + design specs), as JSON.

Key: graph structure with shapes/dtypes/strides + options that change lowering (precision plan,
min partition size, fusion) + torch_xdna and torch versions + NPU generation. Entries are
published atomically (temp file + os.replace) and carry a sha256 of their payload: a corrupt or
truncated entry is detected, warned about, deleted and rebuilt, never used.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch
from torch.fx import GraphModule, Node

FORMAT = 4                  # 3: input-independent values folded before partitioning;
#                             4: view/reduction rewrites, views of inputs left to the host
log = logging.getLogger("torch_xdna.compiler")


class CacheCorruptWarning(UserWarning):
    pass


def _norm(a, index: dict) -> str:
    if isinstance(a, Node):
        return f"%{index[a]}"
    if isinstance(a, (list, tuple)):
        return "[" + ",".join(_norm(x, index) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k}:{_norm(v, index)}" for k, v in sorted(a.items())) + "}"
    return repr(a)


def _meta(n: Node) -> str:
    v = n.meta.get("val")
    vals = v if isinstance(v, (list, tuple)) else [v]
    return ";".join(f"{x.dtype}{list(x.shape)}{list(x.stride())}" if isinstance(x, torch.Tensor)
                    else repr(type(x).__name__) for x in vals)


def graph_key(gm: GraphModule, extra: str) -> str:
    """sha256 of the graph's structure, shapes and `extra` (options, versions, generation)."""
    from torch_xdna.compiler.program import site_of
    import torch_xdna
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    h = hashlib.sha256()
    h.update(f"format={FORMAT};xdna={torch_xdna.__version__};torch={torch.__version__};{extra}\n".encode())
    for n in gm.graph.nodes:
        target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
        if isinstance(n.target, torch._ops.OpOverload):
            target = str(n.target)
        h.update(f"{n.op}|{target}|{_norm(n.args, index)}|{_norm(n.kwargs, index)}|{_meta(n)}|"
                 f"{site_of(n)}\n".encode())
    return h.hexdigest()[:32]


def _path(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / f"graph-{key}.json"


def load(cache_dir: Path, key: str) -> dict | None:
    """The payload stored under `key`, or None (missing, or corrupt: warned and deleted)."""
    p = _path(cache_dir, key)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("xdna compile cache: cannot read %s (%s); rebuilding", p, e)
        return None
    try:
        doc = json.loads(raw)
        payload = doc["payload"]
        body = json.dumps(payload, sort_keys=True).encode()
        if doc.get("format") != FORMAT or doc.get("key") != key:
            raise ValueError("format or key mismatch")
        if hashlib.sha256(body).hexdigest() != doc.get("sha256"):
            raise ValueError("checksum mismatch")
        return payload
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        msg = (f"xdna compile cache entry {p} is corrupt ({e}); it was deleted and the graph is "
               f"being recompiled")
        warnings.warn(msg, CacheCorruptWarning, stacklevel=2)
        log.warning(msg)
        discard(p)
        return None


def discard(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def store(cache_dir: Path, key: str, payload: dict) -> Path | None:
    """Publish an entry atomically; a failure to write is logged, never raised."""
    p = _path(cache_dir, key)
    body = json.dumps(payload, sort_keys=True)
    doc = {"format": FORMAT, "key": key, "sha256": hashlib.sha256(body.encode()).hexdigest(),
           "payload": payload}
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=p.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True)
        os.replace(tmp, p)
        return p
    except OSError as e:
        log.warning("xdna compile cache: cannot write %s (%s); continuing without caching", p, e)
        return None
