"""Trust rules for every on-disk cache (compile plans, quantized weights): fail closed, run uncached.

Trust model. A cache entry decides what runs (a compiled graph) or what the model computes with
(quantized weights), so an entry is used only when this user wrote it:

- The cache directory must be a directory owned by this user and not group/other-writable. It
  is created 0700. Anything else (owned by another uid, mode 0777, a file) -> one warning, and the
  process runs uncached (computes everything, keeps results in memory).
- Every entry carries an HMAC-SHA256 tag under a per-user secret key kept *outside* the cache
  (``$TORCH_XDNA_CACHE_KEY_FILE``, default ``$XDG_CONFIG_HOME/torch-xdna/cache.key``, a 0600 file
  in a 0700 directory, created on first use). A self-described sha256 proves only that an entry
  is intact; anyone who can write the directory can recompute it. The tag cannot be recomputed
  without the key, so a planted or edited entry (gelu -> relu, a re-digested weight file) is
  refused even when the directory checks were bypassed (a shared dir, a restored backup).
- Entries are read only when ``lstat`` shows a regular file owned by this user, not
  group/other-writable, within a size bound; they are opened O_NOFOLLOW|O_NONBLOCK and re-checked
  on the descriptor (a FIFO, a symlink to /dev/zero or a directory is never read from).
- Writes go to a unique temp file in the directory, then ``os.replace`` (atomic; concurrent
  writers never share a temp name). A write that fails (read-only file system, EACCES, a
  directory where the entry belongs, ...) is warned about once per directory; the caller keeps
  its result in memory.
- JSON from disk is parsed with a depth bound: deeper documents are corrupt, not a RecursionError.

This module sits at the runtime layer with no torch import so the compiler and the model loader
share one set of rules.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable

from torch_xdna.runtime import settings

log = logging.getLogger("torch_xdna.cache")

ENV_DIR = "TORCH_XDNA_CACHE_DIR"
ENV_KEY_FILE = "TORCH_XDNA_CACHE_KEY_FILE"
MAX_JSON_DEPTH = 64
KEY_BYTES = 32

_lock = threading.Lock()
_warned: set[tuple[str, str]] = set()
_key_cache: dict[str, bytes] = {}


class CacheTrustWarning(UserWarning):
    """A cache directory, entry or key was refused; the process runs without that cache."""


def warn_once(path: Path | str, topic: str, message: str) -> None:
    """One warning (and log line) per (path, topic) per process."""
    k = (str(path), topic)
    with _lock:
        if k in _warned:
            return
        _warned.add(k)
    warnings.warn(message, CacheTrustWarning, stacklevel=3)
    log.warning(message)


def cache_root() -> Path:
    """$TORCH_XDNA_CACHE_DIR, else $XDG_CACHE_HOME/torch_xdna, else ~/.cache/torch_xdna."""
    env = settings.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    xdg = settings.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "torch_xdna"


def key_file() -> Path:
    env = settings.get(ENV_KEY_FILE)
    if env:
        return Path(env).expanduser()
    xdg = settings.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "torch-xdna" / "cache.key"


def _unsafe(st: os.stat_result, want_dir: bool) -> str | None:
    """Why a stat result is not trusted, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is group/other-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def secret_key() -> bytes | None:
    """This user's cache-signing key (created 0600 on first use); None when it is unusable."""
    path = key_file()
    with _lock:
        hit = _key_cache.get(str(path))
    if hit is not None:
        return hit
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.path.lexists(path):
            # write a complete key under a temp name, then link it into place: a concurrent
            # first use never reads a half-written key, and an existing key is never replaced
            fd, tmp = tempfile.mkstemp(prefix=".cache.key-", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(KEY_BYTES) + "\n")
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp)
        why = _unsafe(os.lstat(path), want_dir=False)
        if why is None and stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
            why = f"is readable by others (mode {stat.S_IMODE(os.lstat(path).st_mode):04o})"
        if why:
            raise PermissionError(why)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(4 * KEY_BYTES).strip()
        key = bytes.fromhex(raw.decode("ascii"))
        if len(key) < 16:
            raise ValueError("key too short")
    except (OSError, ValueError) as e:
        warn_once(path, "key", f"xdna cache: signing key {path} is unusable ({e}); running without "
                  f"the on-disk caches. Fix: rm {path} (it is recreated 0600), or set "
                  f"{ENV_KEY_FILE} to a file only you can read")
        return None
    with _lock:
        _key_cache[str(path)] = key
    return key


def sign(key: bytes, *parts: str | bytes) -> str:
    """HMAC-SHA256 tag over `parts` (length-prefixed, so parts cannot be shifted)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        mac.update(len(b).to_bytes(8, "little"))
        mac.update(b)
    return mac.hexdigest()


def verify(key: bytes, tag: object, *parts: str | bytes) -> bool:
    return isinstance(tag, str) and hmac.compare_digest(sign(key, *parts), tag)


def json_depth_ok(obj, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when `obj` nests lists/dicts at most `limit` deep (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (list, dict)):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return True


def loads_bounded(raw: bytes | str, limit: int = MAX_JSON_DEPTH):
    """json.loads that raises ValueError (never RecursionError) for documents nested too deep."""
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than the interpreter allows (limit {limit})") from None
    if not json_depth_ok(obj, limit):
        raise ValueError(f"JSON nested deeper than {limit} levels")
    return obj


def publish(path: Path, fill: Callable[[int, str], None], mode: int = 0o600) -> Path:
    """Write `path` atomically: `fill(fd, tmp_path)` writes a unique temp file beside it, then
    os.replace (readers see the old file or the whole new one). OSError propagates; the temp
    file never stays behind."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
        try:
            fill(fd, tmp)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
        return path
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


class CacheDir:
    """One trusted cache directory, or a disabled one (reads miss, writes are dropped).

    `usable` is decided once, at construction: the directory is created 0700 if missing and
    must then pass the ownership/mode rules, and the signing key must be available."""

    def __init__(self, path: Path | str, what: str = "cache"):
        self.path = Path(path).expanduser()
        self.what = what
        self.key: bytes | None = None
        self.writable = True
        self.usable = self._check()

    def _check(self) -> bool:
        p = self.path
        try:
            p.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:
            pass                                  # a file (or dangling link) there: lstat says
        except OSError as e:
            if not p.is_dir():
                self._refuse(f"cannot be created ({e.strerror or e})",
                             f"set {ENV_DIR} to a directory you own")
                return False
        try:
            st = os.stat(p)                       # the directory itself (a symlinked ~/.cache is fine)
        except OSError as e:
            self._refuse(f"cannot be read ({e.strerror or e})", f"set {ENV_DIR} to a directory you own")
            return False
        why = _unsafe(st, want_dir=True)
        if why:
            self._refuse(why, f"chown {os.geteuid()} {p} && chmod 700 {p}, or set {ENV_DIR} to a "
                         "private directory")
            return False
        self.key = secret_key()
        return self.key is not None

    def _refuse(self, why: str, fix: str) -> None:
        warn_once(self.path, "dir", f"xdna {self.what} directory {self.path} {why}; it is not "
                  f"trusted and the {self.what} is off for this process (results are computed and "
                  f"kept in memory). Fix: {fix}")

    def entry(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad cache entry name {name!r}")
        return self.path / name

    def open_entry(self, name: str, max_bytes: int) -> int | None:
        """A read-only fd of a trusted entry, or None (missing; refused entries are warned)."""
        if not self.usable:
            return None
        p = self.entry(name)
        try:
            lst = os.lstat(p)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._bad_entry(p, f"cannot be inspected ({e.strerror or e})")
            return None
        why = _unsafe(lst, want_dir=False) or (
            f"is {lst.st_size} bytes, over the {max_bytes}-byte bound" if lst.st_size > max_bytes else None)
        if why:
            self._bad_entry(p, why)
            return None
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            self._bad_entry(p, f"cannot be opened ({e.strerror or e})")
            return None
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) != (lst.st_ino, lst.st_dev) or _unsafe(st, False) or st.st_size > max_bytes:
            os.close(fd)
            self._bad_entry(p, "changed while it was being opened")
            return None
        return fd

    def read(self, name: str, max_bytes: int) -> bytes | None:
        """The bytes of a trusted entry (at most max_bytes), or None."""
        fd = self.open_entry(name, max_bytes)
        if fd is None:
            return None
        try:
            chunks, total = [], 0
            while total <= max_bytes and (chunk := os.read(fd, min(1 << 20, max_bytes + 1 - total))):
                chunks.append(chunk)
                total += len(chunk)
        except OSError as e:
            self._bad_entry(self.entry(name), f"cannot be read ({e.strerror or e})")
            return None
        finally:
            os.close(fd)
        if total > max_bytes:
            self._bad_entry(self.entry(name), f"grew over the {max_bytes}-byte bound")
            return None
        return b"".join(chunks)

    def _bad_entry(self, p: Path, why: str) -> None:
        warn_once(p, "entry", f"xdna {self.what} entry {p} {why}; it is ignored and the result is "
                  f"recomputed. Fix: remove it (rm -rf {p})")

    def write(self, name: str, fill: Callable[[int, str], None]) -> Path | None:
        """Publish an entry: `fill(fd, tmp_path)` writes a unique temp file, then os.replace.

        Any OSError (read-only file system, permissions, a directory in the way) disables writes
        for this directory with one warning; the caller keeps its result in memory."""
        if not self.usable or not self.writable:
            return None
        p = self.entry(name)
        try:
            return publish(p, fill)
        except OSError as e:
            self.writable = False
            kind = errno.errorcode.get(e.errno, type(e).__name__) if e.errno else type(e).__name__
            warn_once(self.path, "write", f"xdna {self.what}: cannot write {p} ({kind}: "
                      f"{e.strerror or e}); continuing with the result kept in memory only")
            return None

    def discard(self, name: str) -> None:
        try:
            p = self.entry(name)
            if stat.S_ISREG(os.lstat(p).st_mode):
                p.unlink()
        except (OSError, ValueError):
            pass
