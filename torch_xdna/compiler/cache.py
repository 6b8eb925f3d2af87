"""On-disk compile cache: graph -> lowered plan (partition assignment + design specs), as JSON.

Key: graph structure with shapes/dtypes/strides + options that change lowering (precision plan,
min partition size, fusion) + torch_xdna and torch versions + NPU generation. The trust rules
are runtime/cachedir.py's: a private directory, regular bounded files, unique temp files + atomic
os.replace, and an HMAC under the per-user key over the payload, so a corrupt, truncated or
planted entry is detected, warned about, deleted and rebuilt, never used. The design classes an
entry may name are a fixed allowlist (compiler/lowered.py).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from pathlib import Path

import torch
from torch.fx import GraphModule, Node

from torch_xdna.runtime.cachedir import CacheDir, loads_bounded, sign, verify

FORMAT = 6                  # 4: view/reduction rewrites, views of inputs left to the host;
#                             5: entries signed with the per-user cache key (runtime/cachedir.py);
#                             6: convs too long for one band are time-tiled (were host nodes)
MAX_ENTRY_BYTES = 64 << 20  # a plan is KBs; anything this large is not ours
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
    from torch_xdna.compiler.fusion import site_of
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


def _name(key: str) -> str:
    return f"graph-{key}.json"


def _path(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / _name(key)


def _corrupt(p: Path, why: str) -> None:
    msg = (f"xdna compile cache entry {p} is corrupt or was not written by you ({why}); it was "
           f"deleted and the graph is being recompiled")
    warnings.warn(msg, CacheCorruptWarning, stacklevel=3)
    log.warning(msg)


def load(cache_dir: Path, key: str) -> dict | None:
    """The payload stored under `key`, or None (missing, untrusted, or corrupt: warned, deleted)."""
    d = CacheDir(cache_dir, "compile cache")
    raw = d.read(_name(key), MAX_ENTRY_BYTES)
    if raw is None:
        return None
    p = _path(cache_dir, key)
    try:
        doc = loads_bounded(raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("payload"), dict):
            raise ValueError("not an entry object")
        if doc.get("format") != FORMAT or doc.get("key") != key:
            raise ValueError("format or key mismatch")
        body = json.dumps(doc["payload"], sort_keys=True)
        if not verify(d.key, doc.get("mac"), f"compile-v{FORMAT}", key, body):
            raise ValueError("signature mismatch")
        return doc["payload"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        _corrupt(p, str(e) or type(e).__name__)
        d.discard(_name(key))
        return None


def discard(p: Path) -> None:
    CacheDir(p.parent, "compile cache").discard(p.name)


def store(cache_dir: Path, key: str, payload: dict) -> Path | None:
    """Publish a signed entry atomically; a failure to write is warned once, never raised."""
    d = CacheDir(cache_dir, "compile cache")
    if not d.usable:
        return None
    body = json.dumps(payload, sort_keys=True)
    doc = {"format": FORMAT, "key": key, "mac": sign(d.key, f"compile-v{FORMAT}", key, body),
           "payload": payload}
    data = json.dumps(doc, sort_keys=True).encode()
    if len(data) > MAX_ENTRY_BYTES:
        log.info("xdna compile cache: entry %s is %d bytes, over the bound; not cached", key, len(data))
        return None

    def fill(fd: int, _tmp: str) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    return d.write(_name(key), fill)
