"""Corpus embedding jobs: a file of texts (.jsonl, .txt, .parquet) -> a parquet of (id, embedding).

The input is cut into fixed chunks (`rows_per_group` input lines or rows each); one chunk is one
embed call and one parquet row group, so the output is the same whoever embeds a chunk (this
process or a Ray worker). Each finished chunk is committed to `OUTPUT.partial/` as its own small
parquet file, then the manifest (written atomically) records it; a killed job restarts after the
last committed chunk (nothing lost, nothing duplicated), after checking that the input is the same
file (size + hash of its first MiB) and the options are the same. The last step merges the parts
into OUTPUT, one row group each, reading one part at a time (memory stays bounded). Reading the
input and embedding one chunk: engine/embed/corpus_source.py.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from torch_xdna.engine.embed.corpus_source import (Chunk, ChunkStats, CorpusError, Source,
                                                   embed_chunk)
from torch_xdna.runtime import settings

MANIFEST_VERSION = 1
TEST_KILL_ENV = "XDNA_TEST_CORPUS_KILL_AFTER"   # test hook: SIGKILL self after N committed chunks


# --- the job --------------------------------------------------------------------------------------
@dataclass
class CorpusSummary:
    """What a job did; `resumed_chunks` > 0 when it continued an interrupted run."""

    input: str
    output: str
    model: str
    dimensions: int
    rows: int = 0
    chunks: int = 0
    resumed_chunks: int = 0
    tokens: int = 0
    truncated: int = 0
    dispatches: int = 0
    npu_ms: float = 0.0                    # modeled on the simulator, measured on hardware
    npu_timing: str = "modeled"
    host_s: float = 0.0                    # measured on this host
    runner: str = "local"
    workers: int = 1
    id_type: str = "int64"

    def to_json(self) -> dict:
        d = asdict(self)
        d["rows_per_s"] = round(self.rows / self.host_s, 1) if self.host_s else None
        return d


@dataclass
class CorpusJob:
    """`xdna embed --input FILE --output FILE.parquet` as a value (the CLI builds one)."""

    input: str | Path
    output: str | Path
    model: str | None = None
    text_field: str | None = None
    id_field: str | None = None
    batch_size: int = 32
    rows_per_group: int = 1024
    overwrite: bool = False
    progress: bool = False
    ray_address: str | None = None          # set (possibly "") to run on Ray; "" = local/auto
    ray_workers: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def on_ray(self) -> bool:
        return self.ray_address is not None


def partial_dir(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _model_identity(model: str | None) -> str:
    if model is None:
        return "default:all-MiniLM-L6-v2"
    return str(Path(model).expanduser().resolve())


class _Parts:
    """OUTPUT.partial/: committed chunk files + manifest.json (the resume point)."""

    def __init__(self, job: CorpusJob, source: Source):
        self.out = Path(job.output)
        self.dir = partial_dir(self.out)
        self.want = {"version": MANIFEST_VERSION, "input": source.fingerprint(),
                     "format": source.fmt, "text_field": source.text_field,
                     "id_field": source.id_field, "rows_per_group": job.rows_per_group,
                     "model": _model_identity(job.model)}
        self.manifest: dict = {}

    def open(self, overwrite: bool) -> dict:
        if overwrite and self.dir.exists():
            shutil.rmtree(self.dir)
        mpath = self.dir / "manifest.json"
        if mpath.is_file():
            m = json.loads(mpath.read_text())
            for k, v in self.want.items():
                if m.get(k) != v:
                    raise CorpusError(
                        f"{self.dir} belongs to an interrupted job with a different {k} "
                        f"({m.get(k)!r} there, {v!r} now); rerun with the same input and options "
                        f"to resume it, or pass --overwrite to start over")
            self.manifest = m
        else:
            if self.out.exists() and not overwrite:
                raise CorpusError(f"{self.out} exists; pass --overwrite to replace it")
            self.dir.mkdir(parents=True, exist_ok=True)
            self.manifest = dict(self.want, chunks_done=0, rows=0, next=None, complete=False,
                                 id_type=None, dim=None)
            self._save()
        return self.manifest

    def _save(self) -> None:
        _atomic_write(self.dir / "manifest.json", json.dumps(self.manifest, indent=1).encode())

    def part(self, i: int) -> Path:
        return self.dir / f"part-{i:06d}.parquet"

    def commit(self, table, nxt: Chunk | None) -> None:
        """Write chunk `chunks_done` durably, then advance the manifest past it."""
        import pyarrow.parquet as pq
        i = self.manifest["chunks_done"]
        id_type = str(table.schema.field("id").type) if table.num_rows else None
        want = self.manifest["id_type"]
        if id_type and want and id_type != want:
            raise CorpusError(f"chunk {i}: ids are {id_type} but earlier ids are {want}; "
                              f"make the id field one type across the corpus")
        tmp = self.part(i).with_suffix(".tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.part(i))
        self.manifest.update(chunks_done=i + 1, rows=self.manifest["rows"] + table.num_rows,
                             next=asdict(nxt) if nxt else None, complete=nxt is None,
                             id_type=want or id_type)
        self._save()

    def finish(self, metadata: dict[str, str], dim: int) -> int:
        """Merge the parts into OUTPUT (one row group per part); returns rows written."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        id_type = self.manifest["id_type"] or "int64"
        schema = pa.schema([("id", pa.int64() if id_type == "int64" else pa.string()),
                            ("embedding", pa.list_(pa.float32(), dim)),
                            ("tokens", pa.int32()), ("truncated", pa.bool_())],
                           metadata={k: str(v) for k, v in metadata.items()})
        tmp = self.out.with_name(self.out.name + ".tmp")
        rows = 0
        with pq.ParquetWriter(tmp, schema) as w:
            for i in range(self.manifest["chunks_done"]):
                t = pq.read_table(self.part(i))
                if not t.num_rows:
                    continue
                t = t.drop_columns(["chunk"]).cast(schema)
                w.write_table(t, row_group_size=max(1, t.num_rows))
                rows += t.num_rows
        os.replace(tmp, self.out)
        shutil.rmtree(self.dir)
        return rows


def _kill_hook() -> Callable[[int], None]:
    n = settings.get(TEST_KILL_ENV)
    if not n:
        return lambda done: None

    def hook(done: int) -> None:
        if done >= int(n):
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


def run_job(job: CorpusJob, embedder_factory: Callable[[], Any] | None = None) -> CorpusSummary:
    """Run (or resume) a corpus job. `embedder_factory` builds the local embedder (tests pass one
    to share a loaded model); Ray workers always build their own from `job.model`."""
    if job.rows_per_group < 1 or job.batch_size < 1:
        raise CorpusError("--row-group-size and --batch-size must be >= 1")
    source = Source.open(job.input, job.text_field, job.id_field)
    parts = _Parts(job, source)
    m = parts.open(job.overwrite)
    resumed = m["chunks_done"]
    t0 = time.perf_counter()
    factory = embedder_factory or (lambda: load_embedder(job.model, job.batch_size))
    embedder = None if job.on_ray else factory()
    name, dim = (embedder.name, embedder.dim) if embedder else _model_info(job.model)
    timing = "measured" if _backend(embedder) == "xrt" else "modeled"
    m.update(dim=dim, model_name=name)
    summary = CorpusSummary(str(job.input), str(job.output), name, dim, resumed_chunks=resumed,
                            rows=m["rows"], chunks=resumed, npu_timing=timing,
                            runner="ray" if job.on_ray else "local")
    if not m["complete"]:
        start = Chunk(**m["next"]) if m["next"] else None
        if resumed and start is None:
            raise CorpusError(f"{parts.dir}/manifest.json is inconsistent; pass --overwrite")
        bar = _progress(job, source, start)
        kill = _kill_hook()
        chunks = source.chunks(job.rows_per_group, start)
        tables = (_ray_tables(job, source, chunks, summary) if job.on_ray
                  else _local_tables(embedder, source, chunks))
        done_here = 0
        for c, table, nxt, st in _lookahead(tables):
            parts.commit(table, nxt)
            done_here += 1
            summary.rows += st.rows
            summary.chunks += 1
            summary.tokens += st.tokens
            summary.truncated += st.truncated
            summary.dispatches += st.dispatches
            summary.npu_ms += st.modeled_us / 1e3
            if bar is not None:
                bar.update((c.end - c.start))
                bar.set_postfix(rows=summary.rows, refresh=False)
            kill(done_here)
        if bar is not None:
            bar.close()
        if not parts.manifest["complete"]:            # empty input: nothing was committed
            parts.manifest.update(complete=True)
            parts._save()
    summary.id_type = parts.manifest["id_type"] or "int64"
    summary.rows = parts.finish({"model": name, "dimensions": dim, "input": source.path,
                                 "producer": "torch-xdna xdna embed"}, dim)
    summary.host_s = time.perf_counter() - t0
    if embedder is not None and embedder_factory is None:
        embedder.close()
    return summary


def _model_info(model: str | None) -> tuple[str, int]:
    """(name, dimensions) from the model directory's config, without loading weights."""
    from torch_xdna.engine.embed.embedder import default_model_dir
    from torch_xdna.models.encoder import load_spec
    spec = (load_spec(model) if model else load_spec(default_model_dir(), name="all-MiniLM-L6-v2"))
    return spec.name, spec.dim


def _backend(embedder) -> str:
    if embedder is not None:
        return embedder.dev.backend
    from torch_xdna.runtime import backend_name
    return backend_name()


def load_embedder(model: str | None, batch_size: int):
    from torch_xdna.engine.embed.embedder import Embedder
    return Embedder.load(model, max_batch=batch_size)


def _local_tables(embedder, source: Source, chunks: Iterable[Chunk]):
    for c in chunks:
        table, st = embed_chunk(embedder, source, c)
        yield c, table, st


def _lookahead(items: Iterable[tuple]) -> Iterator[tuple]:
    """(chunk, table, next chunk or None, stats): the manifest needs the next resume point."""
    prev = None
    for item in items:
        if prev is not None:
            yield prev[0], prev[1], item[0], prev[2]
        prev = item
    if prev is not None:
        yield prev[0], prev[1], None, prev[2]


def _progress(job: CorpusJob, source: Source, start: Chunk | None):
    if not job.progress:
        return None
    from tqdm import tqdm
    total, unit = source.total()
    return tqdm(total=total, initial=start.start if start else 0, unit=unit,
                unit_scale=unit == "B", desc="embedding", file=sys.stderr, dynamic_ncols=True)


# --- Ray ------------------------------------------------------------------------------------------
class RayEmbedWorker:
    """One embedder per Ray actor (its own simulated or real NPU); embeds whole chunks."""

    def __init__(self, source: Source, model: str | None, batch_size: int, threads: int = 1):
        import torch
        torch.set_num_threads(max(1, threads))
        self.source = source
        self.embedder = load_embedder(model, batch_size)

    def __call__(self, batch):
        import pyarrow as pa
        out = []
        for row in batch.to_pylist():
            c = Chunk(row["index"], row["start"], row["end"], row["first"])
            table, st = embed_chunk(self.embedder, self.source, c)
            n = table.num_rows
            out.append(table.append_column("modeled_us", pa.array([st.modeled_us] + [0.0] * (n - 1)
                                                                  if n else [], pa.float64()))
                       .append_column("dispatches", pa.array([st.dispatches] + [0] * (n - 1)
                                                             if n else [], pa.int64())))
        return pa.concat_tables(out) if out else batch.slice(0, 0)


def ray_workers(job: CorpusJob) -> int:
    """Workers sized for the cluster: one per CPU (each worker runs one single-threaded
    embedder), unless --ray-workers says otherwise."""
    import ray
    if job.ray_workers:
        return job.ray_workers
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _ray_tables(job: CorpusJob, source: Source, chunks: Iterable[Chunk], summary: CorpusSummary):
    """Chunks embedded by a pool of Ray actors, returned in chunk order (preserve_order)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise CorpusError("--ray needs Ray Data: pip install 'torch-xdna[cluster]'") from None
    import pyarrow as pa
    import pyarrow.compute as pc
    if not ray.is_initialized():
        ray.init(address=job.ray_address or None, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    descs = [asdict(c) for c in chunks]
    if not descs:
        return
    by_index = {d["index"]: Chunk(**d) for d in descs}
    workers = min(ray_workers(job), len(descs))
    summary.workers = workers
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ds = ray.data.from_items(descs, override_num_blocks=min(len(descs), 4 * workers))
    ds = ds.map_batches(RayEmbedWorker, batch_size=1, batch_format="pyarrow",
                        fn_constructor_kwargs={"source": source, "model": _ray_model(job.model),
                                               "batch_size": job.batch_size},
                        compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1)
    pending = None
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        if not batch.num_rows:
            continue
        for idx in _unique_in_order(batch.column("chunk").to_pylist()):
            part = batch.filter(pc.equal(batch.column("chunk"), idx))
            if pending is not None and pending[0] == idx:
                pending = (idx, pa.concat_tables([pending[1], part]))
                continue
            if pending is not None:
                yield _ray_item(by_index, pending)
            pending = (idx, part)
    if pending is not None:
        yield _ray_item(by_index, pending)
    # a chunk of only blank lines returns no rows and is not committed: the resume point moves
    # past it with the next chunk, and the merged output is the same as a local run's


def _unique_in_order(xs: list) -> list:
    seen: dict = {}
    for x in xs:
        seen.setdefault(x, None)
    return list(seen)


def _ray_item(by_index: dict, pending: tuple):
    idx, t = pending
    st = ChunkStats(t.num_rows, int(sum(t.column("tokens").to_pylist())),
                    int(sum(t.column("truncated").to_pylist())),
                    float(sum(t.column("modeled_us").to_pylist())),
                    int(sum(t.column("dispatches").to_pylist())))
    return by_index[idx], t.drop_columns(["modeled_us", "dispatches"]), st


def _ray_model(model: str | None) -> str | None:
    return str(Path(model).expanduser().resolve()) if model else None
