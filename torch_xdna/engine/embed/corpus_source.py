"""A corpus file read in fixed chunks, and one chunk embedded into a parquet table.

The input side of a corpus job (engine/embed/corpus.py): .jsonl / .txt / .parquet sources, their
chunking (`rows_per_group` lines or rows, so every runner cuts the same chunks), the fingerprint
a resumed job checks, and `embed_chunk`, which a local run and a Ray worker both call.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt", ".parquet": "parquet"}
HEAD_BYTES = 1 << 20                       # input fingerprint: size + sha256 of the first MiB


class CorpusError(ValueError):
    """A corpus job cannot start or continue; the message says what to change."""


@dataclass(frozen=True)
class Chunk:
    """One unit of work: input lines/rows [start, end) as byte offsets (txt/jsonl) or row
    offsets (parquet); `first` is the 1-based line number (txt/jsonl) or row index (parquet)."""

    index: int
    start: int
    end: int
    first: int


@dataclass(frozen=True)
class Source:
    """The input file and how to read it (picklable: Ray workers read their own chunks)."""

    path: str
    fmt: str
    text_field: str = "text"
    id_field: str | None = None            # None: jsonl 'id' if present, else line number

    @classmethod
    def open(cls, path: str | Path, text_field: str | None = None,
             id_field: str | None = None) -> "Source":
        p = Path(path)
        fmt = FORMATS.get(p.suffix.lower())
        if fmt is None:
            raise CorpusError(f"{p}: unknown corpus format {p.suffix!r}; use one of "
                              f"{', '.join(sorted(FORMATS))}")
        if not p.is_file():
            raise CorpusError(f"{p}: no such file")
        return cls(str(p.resolve()), fmt, text_field or "text", id_field)

    # --- chunking ---------------------------------------------------------------------------
    def chunks(self, rows: int, start: Chunk | None = None) -> Iterator[Chunk]:
        """Chunks of `rows` lines/rows from the beginning, or from `start` (a resume point)."""
        index, pos, first = (start.index, start.start, start.first) if start else (0, 0, 1)
        if self.fmt == "parquet":
            n = _parquet_file(self.path).metadata.num_rows
            pos = pos if start else 0
            while pos < n:
                end = min(n, pos + rows)
                yield Chunk(index, pos, end, pos)
                index, pos = index + 1, end
            return
        with open(self.path, "rb") as f:
            f.seek(pos)
            while True:
                lines = 0
                cstart = pos
                for line in f:
                    pos += len(line)
                    lines += 1
                    if lines == rows:
                        break
                if not lines:
                    return
                yield Chunk(index, cstart, pos, first)
                index, first = index + 1, first + lines

    def total(self) -> tuple[int, str]:
        """Progress-bar total: rows for parquet, bytes for text formats."""
        if self.fmt == "parquet":
            return _parquet_file(self.path).metadata.num_rows, "rows"
        return os.path.getsize(self.path), "B"

    # --- reading ----------------------------------------------------------------------------
    def read(self, c: Chunk) -> tuple[list, list[str]]:
        """(ids, texts) of one chunk; blank lines of txt/jsonl are skipped (ids keep counting)."""
        if self.fmt == "parquet":
            return self._read_parquet(c)
        with open(self.path, "rb") as f:
            f.seek(c.start)
            data = f.read(c.end - c.start)
        ids: list = []
        texts: list[str] = []
        for k, raw in enumerate(data.split(b"\n")[: _line_count(data)]):
            lineno = c.first + k
            try:
                line = raw.decode("utf-8").rstrip("\r")
            except UnicodeDecodeError as e:
                raise CorpusError(f"{self.path}:{lineno}: not UTF-8 ({e.reason} at byte "
                                  f"{e.start}); re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            if self.fmt == "txt":
                ids.append(lineno)
                texts.append(line)
                continue
            ident, text = self._json_record(line, lineno)
            ids.append(ident)
            texts.append(text)
        return ids, texts

    def _json_record(self, line: str, lineno: int) -> tuple[Any, str]:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CorpusError(f"{self.path}:{lineno}: invalid JSON ({e.msg} at column "
                              f"{e.colno})") from None
        if not isinstance(obj, dict):
            raise CorpusError(f"{self.path}:{lineno}: a JSON object per line is expected, "
                              f"got {type(obj).__name__}")
        text = obj.get(self.text_field)
        if not isinstance(text, str):
            keys = ", ".join(list(obj)[:8])
            raise CorpusError(f"{self.path}:{lineno}: no string field {self.text_field!r} "
                              f"(fields: {keys}); pass --text-field NAME")
        key = self.id_field or "id"
        if key in obj:
            ident = obj[key]
            if isinstance(ident, bool) or not isinstance(ident, (int, str)):
                raise CorpusError(f"{self.path}:{lineno}: id field {key!r} must be an integer "
                                  f"or a string, got {type(ident).__name__}")
            return ident, text
        if self.id_field:
            raise CorpusError(f"{self.path}:{lineno}: no id field {self.id_field!r}")
        return lineno, text

    def _read_parquet(self, c: Chunk) -> tuple[list, list[str]]:
        pf = _parquet_file(self.path)
        names = pf.schema_arrow.names
        if self.text_field not in names:
            raise CorpusError(f"{self.path}: no column {self.text_field!r} (columns: "
                              f"{', '.join(names)}); pass --text-field NAME")
        id_col = self.id_field or ("id" if "id" in names else None)
        if id_col and id_col not in names:
            raise CorpusError(f"{self.path}: no id column {id_col!r} (columns: {', '.join(names)})")
        cols = [self.text_field] + ([id_col] if id_col else [])
        table = _parquet_rows(pf, c.start, c.end, cols)
        texts = table.column(self.text_field).to_pylist()
        for k, t in enumerate(texts):
            if not isinstance(t, str):
                raise CorpusError(f"{self.path}: row {c.start + k}: column {self.text_field!r} "
                                  f"is {type(t).__name__}, not a string")
        ids = (table.column(id_col).to_pylist() if id_col else list(range(c.start, c.end)))
        return ids, texts

    def fingerprint(self) -> dict:
        with open(self.path, "rb") as f:
            head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()
        return {"path": self.path, "size": os.path.getsize(self.path), "head_sha256": head}


def _line_count(data: bytes) -> int:
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def _parquet_file(path: str):
    import pyarrow.parquet as pq
    return pq.ParquetFile(path)


def _parquet_rows(pf, start: int, end: int, cols: list[str]):
    """Rows [start, end) of a parquet file, reading only the row groups they span."""
    import pyarrow as pa
    groups, base, offset = [], 0, None
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if base + n > start and base < end:
            groups.append(g)
            offset = base if offset is None else offset
        base += n
    if not groups:
        return pa.table({c: [] for c in cols})
    t = pf.read_row_groups(groups, columns=cols)
    return t.slice(start - offset, end - start)


# --- embedding one chunk ------------------------------------------------------------------------
@dataclass
class ChunkStats:
    rows: int = 0
    tokens: int = 0
    truncated: int = 0
    modeled_us: float = 0.0
    dispatches: int = 0


def embed_chunk(embedder, source: Source, c: Chunk):
    """One chunk -> a pyarrow table (chunk, id, embedding[dim] float32, tokens)."""
    import numpy as np
    import pyarrow as pa
    from torch_xdna.engine.embed.embedder import EmbedStats
    ids, texts = source.read(c)
    texts, skip = embedder.with_prompt(texts)        # the model's default prompt, if any
    full = embedder.tokenize(texts, truncate=False) if texts else []
    limit = embedder.spec.max_seq_length
    seqs = [embedder.tokenizer.truncate(x) for x in full]
    stats = EmbedStats()
    vecs = (embedder.embed_ids(seqs, stats, pool_skip=skip).numpy().astype(np.float32) if seqs
            else np.zeros((0, embedder.dim), np.float32))
    flat = pa.array(vecs.reshape(-1), pa.float32())
    return pa.table({
        "chunk": pa.array([c.index] * len(ids), pa.int64()),
        "id": _id_array(ids, source, c),
        "embedding": pa.FixedSizeListArray.from_arrays(flat, embedder.dim),
        "tokens": pa.array([len(s) for s in seqs], pa.int32()),
        "truncated": pa.array([len(x) > limit for x in full], pa.bool_()),
    }), ChunkStats(len(ids), stats.tokens, sum(len(x) > limit for x in full),
                   stats.modeled_us, stats.dispatches)


def _id_array(ids: list, source: Source, c: Chunk):
    import pyarrow as pa
    kinds = {type(i) for i in ids}
    if len(kinds) > 1:
        raise CorpusError(f"{source.path}: ids in lines/rows from {c.first} mix "
                          f"{' and '.join(sorted(k.__name__ for k in kinds))}; make them one type")
    try:
        return pa.array(ids, pa.int64() if kinds <= {int} else None)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise CorpusError(f"{source.path}: ids from line/row {c.first}: {e}") from None
