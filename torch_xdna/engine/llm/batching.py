"""Continuous batching: concurrent generations on one engine decode together, one batched step
(kernels/blocks/llm_batch.py: batch-N GEMMs over the resident weights, per-sequence KV and positions)
per token, and join or leave between steps.

    session = BatchSession(engine, slots=8)
    a = session.add([5, 6, 7], GenerationConfig(max_tokens=16))     # prefilled now
    while session.active:
        session.step()                   # one token for every active sequence
        b = b or session.add(...)        # joiners enter between steps
    a.token_ids, a.finish_reason

A joining sequence is prefilled alone on the engine's decoder (with the prefix cache, if any)
and its KV copied into a free slot; then it decodes in the batch. Each sequence's tokens are
the ones it gets alone (tests/test_batching.py). Token ids out; the caller decodes text.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from torch_xdna.engine.llm.decoder import step_designs
from torch_xdna.engine.counters import CounterDelta
from torch_xdna.engine.llm.generate import (Chunk, Engine, EngineBusy, GenerationConfig,
                                            GenerationStats)
from torch_xdna.engine.llm.text_stream import TextStream
from torch_xdna.engine.llm.kv_cache import KVCache, kv_bytes_per_token
from torch_xdna.engine.llm.sampler import Sampler
from torch_xdna.kernels.blocks.llm_batch import BatchedHeadDesign, BatchedLayerDesign
from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.runtime import Launch, Program
from torch_xdna.runtime.buffer import Coherence


class SessionFull(RuntimeError):
    """Every KV slot of the batch session holds a running sequence."""


# A slot is a full-capacity KV cache plus its rows of the step's activations; the session takes
# at most this share of the device memory free when it opens (headroom for the prefix cache
# and program scratch), so a batch never pushes the device out of memory.
BATCH_MEMORY_SHARE = 0.9


def unsupported(engine: Engine, config: GenerationConfig) -> str | None:
    """Why `config` cannot decode in a batch session (None: it can). The session samples with
    temperature/top-k/top-p/seed and stop tokens only; everything that needs per-sequence
    logits processors, the token history or several samples runs alone."""
    if engine.decoder.dev.backend != "sim":
        return "backend"                        # the batched step's designs (blocks/llm_batch.py)
        #                                         have no executable stages: no chip artifact
    if getattr(engine.decoder, "kv_dtype", "bf16") != "bf16":
        return "kv_dtype"                       # slots hold bf16/fp32 KV (no int8 batch layer)
    if getattr(engine.decoder, "states", None):
        return "linear_attention"               # slots hold KV only, not recurrent states
    if getattr(getattr(engine, "spec", None), "per_layer_shapes", False):
        return "per_layer_shapes"               # slots and batch layers assume one layer shape
    if config.n != 1:
        return "n"
    if config.repetition_penalty != 1.0:
        return "repetition_penalty"
    if config.presence_penalty or config.frequency_penalty or config.logit_bias:
        return "penalties"
    if config.grammar is not None or config.processors:
        return "grammar"
    if config.logprobs is not None:
        return "logprobs"
    return None


def slot_bytes(engine: Engine) -> int:
    """Device bytes one batch slot takes: its KV cache at the engine's capacity and its rows
    of the step's activations, ids and logits."""
    dec, spec = engine.decoder, engine.spec
    kv = dec.capacity * kv_bytes_per_token(spec.layers, spec.kv_heads, spec.head_dim, "bf16",
                                           dec.policy.exact)
    return kv + (spec.hidden + 1 + spec.vocab) * 4


def slots_for_budget(engine: Engine, max_batch: int) -> int:
    """How many slots a session may open now: at most max_batch, and only as many as fit
    BATCH_MEMORY_SHARE of the device memory free (TORCH_XDNA_MEMORY_BUDGET); 0 = none fits."""
    dev = engine.decoder.dev
    free = max(0, dev.memory_budget - dev.counters.allocated_bytes)
    return int(max(0, min(max_batch, int(free * BATCH_MEMORY_SHARE) // slot_bytes(engine))))


@dataclass
class Sequence:
    """One generation in a batch session."""

    prompt: list[int]
    config: GenerationConfig
    slot: int
    sampler: Sampler
    stop_ids: set
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    next_token: int | None = None       # sampled, not yet fed (its KV is not written yet)
    cached_tokens: int = 0
    error: BaseException | None = None  # this sequence failed (finish_reason "error")
    fed: int = 0                        # generated tokens whose KV the slot holds

    @property
    def position(self) -> int:
        return len(self.prompt) + len(self.token_ids) - 1


class BatchSession:
    """Up to `slots` sequences decoding together on `engine` (holds the engine's lock: no other
    generation runs on it meanwhile; close() releases it and frees the slots)."""

    def __init__(self, engine: Engine, slots: int = 8):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if not engine._lock.acquire(blocking=False):
            raise EngineBusy("a generation is already running on this engine")
        self.engine, self.dec, self.slots = engine, engine.decoder, slots
        dec, spec = self.dec, engine.spec
        self._owned = []
        try:
            dtype = torch.float32 if dec.policy.exact else torch.bfloat16
            self.caches = [KVCache.allocate(dec.dev, spec.layers, spec.kv_heads, spec.head_dim,
                                            dec.capacity, dtype) for _ in range(slots)]
            for c in self.caches:
                self._owned += c.k + c.v
            self.x = self._empty((slots, spec.hidden), torch.float32)
            self.ids = self._empty((slots,), torch.int32)
            self.logits = self._empty((slots, spec.vocab), torch.float32)
        except BaseException:
            self.close()
            raise
        self.seqs: list[Sequence] = []
        self._free = list(range(slots))
        self._scalars: dict = {"n": 1, "slot": (0,), "pos": (0,)}
        self._programs: dict[int, Program] = {}
        self.steps = 0
        self.modeled_step_us: list[tuple[int, float]] = []     # (batch size, modeled us)

    def _empty(self, shape, dtype):
        a = self.dec.dev.empty(shape, dtype)
        self._owned.append(a)
        return a

    @property
    def active(self) -> list[Sequence]:
        return [s for s in self.seqs if s.finish_reason is None]

    # -- joining ----------------------------------------------------------------------------
    def add(self, prompt: list[int], config: GenerationConfig | None = None) -> Sequence:
        """Prefill `prompt` alone and put it in a free slot; its first token is sampled now."""
        config = config or GenerationConfig()
        if not self._free:
            raise SessionFull(f"all {self.slots} slots are decoding; wait for one to finish")
        eng, dec = self.engine, self.dec
        if not prompt or len(prompt) + max(config.max_tokens, 1) > dec.capacity:
            raise ValueError(f"a prompt of {len(prompt)} tokens + {config.max_tokens} new ones "
                             f"does not fit the KV cache ({dec.capacity})")
        why = unsupported(eng, config)
        if why is not None:
            raise ValueError(f"{why} is not supported in a batch session; generate it alone")
        stop = eng.eos_token_ids if config.stop_token_ids is None else config.stop_token_ids
        seq = Sequence(list(prompt), config, self._free[0], Sampler(config.sampling()), set(stop))
        pc = eng.prefix_cache
        reused = pc.restore(dec.dev, dec.cache, prompt) if pc is not None else dec.reset() or 0
        seq.cached_tokens = reused
        logits = dec.forward(prompt[reused:])      # a bad prompt raises here: its slot stays free
        if pc is not None:
            pc.store(dec.dev, dec.cache, prompt)
        self._copy_kv(dec.cache, self.caches[seq.slot], len(prompt))
        self._free.pop(0)
        self.seqs.append(seq)
        try:
            self._accept(seq, logits)
        except BaseException:
            self._finish(seq, "error")
            raise
        return seq

    def _copy_kv(self, src: KVCache, dst: KVCache, n: int) -> None:
        dev = self.dec.dev
        for a, b in zip(src.k + src.v, dst.k + dst.v):
            dev.read(a.buffer)
            dev.read(b.buffer)
            b.host_view()[:, :n].copy_(a.host_view()[:, :n])
            b.buffer.state = Coherence.HOST_DIRTY      # flushed before the next launch
        dst.length = n

    def _accept(self, seq: Sequence, logits: torch.Tensor) -> None:
        token = seq.sampler(logits)
        if token in seq.stop_ids:
            self._finish(seq, "stop")
        elif len(seq.token_ids) >= seq.config.max_tokens:
            self._finish(seq, "length")
        else:
            seq.token_ids.append(token)
            if len(seq.token_ids) >= seq.config.max_tokens:
                self._finish(seq, "length")        # the last token's KV is never needed
            else:
                seq.next_token = token

    def _finish(self, seq: Sequence, reason: str) -> None:
        fed = seq.fed
        seq.finish_reason, seq.next_token = reason, None
        pc = self.engine.prefix_cache
        if pc is not None and reason != "error" and fed > 0:
            # keep prompt + answer for the next turn, as a generation alone does (the tokens
            # whose KV the slot holds: the last sampled one was never fed)
            cache = self.caches[seq.slot]
            cache.length = len(seq.prompt) + fed
            pc.store(self.dec.dev, cache, seq.prompt + seq.token_ids[:fed])
        self._free.append(seq.slot)
        self._free.sort()

    # -- stepping ---------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Feed every active sequence its last token in one batched launch chain; sample the
        next. Returns the sequences that were advanced."""
        batch = [s for s in self.active if s.next_token is not None]
        if not batch:
            return []
        dev, n = self.dec.dev, len(batch)
        counters = CounterDelta(dev)
        dev.write(self.ids.buffer, torch.tensor([s.next_token for s in batch], dtype=torch.int32))
        self._scalars.update(n=n, slot=tuple(s.slot for s in batch),
                             pos=tuple(s.position for s in batch))
        dev.run_program(self.program(rows_bucket(n, self.slots)))
        logits = dev.download(self.logits)
        self.modeled_step_us.append((n, counters.take()["modeled_us"]))
        self.steps += 1
        for r, s in enumerate(batch):
            s.fed += 1
            try:
                self._accept(s, logits[r])
            except Exception as e:      # noqa: BLE001 - one sequence's failure (its sampler)
                s.error = e             # ends that sequence only
                self._finish(s, "error")
        return batch

    def program(self, rows: int) -> Program:
        """The batched step for `rows` (bucketed) sequences: embed, one launch per layer, head."""
        prog = self._programs.get(rows)
        if prog is not None:
            return prog
        dec, s = self.dec, self._scalars
        x, ids = dec.rows_view(self.x, rows), dec.rows_view(self.ids, rows)
        designs = step_designs(dec.spec, dec.policy, 1, dec.capacity, True, "layer")
        launches = []
        for role, i, design in designs:
            if role == "embed":
                launches.append(Launch(dataclasses.replace(design, rows=rows),
                                       dec.embed_inputs(ids), [x], s, op="embed"))
            elif role == "head":
                launches.append(Launch(BatchedHeadDesign(design, rows), dec.head_inputs(x),
                                       [dec.rows_view(self.logits, rows)], s, op="lm_head"))
            else:
                ins = dec.attention_inputs(x, i) + dec.mlp_inputs(x, i)[1:]
                outs = [x] + [c.k[i] for c in self.caches] + [c.v[i] for c in self.caches]
                launches.append(Launch(BatchedLayerDesign(design, rows, self.slots), ins, outs, s,
                                       op=f"layer{i}.batch"))
        prog = Program(launches, name=f"{dec.spec.family}.decode_batch")
        self._programs[rows] = prog
        return prog

    def run(self) -> None:
        """Step until every sequence has finished."""
        while self.step():
            pass

    def close(self) -> None:
        """Free the slots and release the engine."""
        for a in self._owned:
            self.dec.dev.free(a.buffer)
        self._owned = []
        self._programs = {}
        try:
            self.engine._lock.release()
        except RuntimeError:
            pass

    def __enter__(self) -> "BatchSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def batch_step_designs(spec, policy, n: int, slots: int, capacity: int) -> list:
    """The designs of one batched decode step of `n` sequences (rows bucketed as the session
    does): embed, one batched launch per layer, the batched head."""
    rows = rows_bucket(n, slots)
    out = []
    for role, _, d in step_designs(spec, policy, 1, capacity, True, "layer"):
        if role == "embed":
            out.append(dataclasses.replace(d, rows=rows))
        elif role == "head":
            out.append(BatchedHeadDesign(d, rows))
        else:
            out.append(BatchedLayerDesign(d, rows, slots))
    return out


def estimate_batch_step(spec, policy, cost, positions: tuple, slots: int, capacity: int) -> dict:
    """Modeled cost of one batched step from plans only (no weights), charged through `cost` (a
    runtime.sim.cost.CostModel) at the sequences' positions, as the simulator charges it."""
    n = len(positions)
    designs = batch_step_designs(spec, policy, n, slots, capacity)
    sc = {"n": n, "pos": tuple(positions), "slot": tuple(range(n))}
    plans = [d.launch_plan(cost.gen, **sc) if hasattr(d, "launch_plan") else d.plan(cost.gen)
             for d in designs]
    terms = cost.charge_program([(d.key, p, d.runs()) for d, p in zip(designs, plans)])
    us = sum(t.total for t in terms)
    return {"sequences": n, "modeled_us": us, "modeled_tok_s": n / (us * 1e-6),
            "dram_bytes": sum(p.dram_read_bytes + p.dram_write_bytes for p in plans),
            "weight_bytes": sum(p.notes.get("weight_bytes", 0) for p in plans)}


class BatchRunner:
    """Continuous batching for concurrent callers (the server's request threads): `submit` queues
    a generation and returns a Handle; `drive` is ONE device job (the server's DeviceWorker runs
    it) that admits queued generations between steps and steps until none is left. `submit`
    reports whether a drive job must be scheduled (none is running or queued).

    slots: an int, or a callable giving the slot count when a drive opens its session (the
    server: slots_for_budget); 0 (nothing fits the memory) serves the queued generations one by
    one on the engine's own decoder, with the same tokens. yield_to: checked between steps;
    True (other device work is waiting) stops admitting: the batch drains and drive() returns
    True, meaning generations are still queued and another drive must be scheduled."""

    def __init__(self, engine: Engine, slots: int | Callable[[], int] = 8,
                 yield_to: Callable[[], bool] | None = None):
        self.engine, self.slots, self.yield_to = engine, slots, yield_to
        self._lock = threading.Lock()
        self._pending: list[Handle] = []
        self._driving = False
        self.max_batch = 0
        self.active = 0                     # sequences decoding in the running session
        self.sessions = 0                   # drives that opened a batch session
        self.alone = 0                      # generations served alone (no slot fitted)

    @property
    def queued(self) -> int:
        """Generations waiting to be admitted."""
        with self._lock:
            return len(self._pending)

    def submit(self, prompt: list[int], config: GenerationConfig | None = None) -> tuple["Handle", bool]:
        h = Handle(list(prompt), config or GenerationConfig())
        with self._lock:
            self._pending.append(h)
            start = not self._driving
            self._driving = True
        return h, start

    def fail_pending(self, error: BaseException) -> None:
        """End every queued generation with `error` (its drive job will not run)."""
        with self._lock:
            pending, self._pending, self._driving = self._pending, [], False
        for h in pending:
            h._done(None, error)

    def drive(self) -> bool:
        """Run until no generation is queued or decoding (call on the device thread). True:
        it yielded to other device work with generations still queued (schedule it again)."""
        n_slots = self.slots() if callable(self.slots) else self.slots
        if n_slots < 1:
            return self._drive_alone()
        session = None
        first = True                        # a fresh drive waited its turn: it always admits
        try:
            session = BatchSession(self.engine, n_slots)
            self.sessions += 1
            while True:
                hold = not first and self.yield_to is not None and self.yield_to()
                first = False
                with self._lock:
                    n_free = 0 if hold else len(session._free)
                    joiners, self._pending = self._pending[:n_free], self._pending[n_free:]
                    if not joiners and not session.active:
                        self._driving = again = bool(self._pending)
                        return again
                for h in joiners:
                    if h.cancelled:
                        h._done("cancelled")
                        continue
                    try:
                        h.seq = session.add(h.prompt, h.config)
                    except Exception as e:      # noqa: BLE001 - delivered to that caller
                        h._done(None, e)
                        continue
                    h._emit()
                for h in [x for x in self._handles(session) if x.cancelled and x.seq.finish_reason is None]:
                    session._finish(h.seq, "cancelled")
                    h._emit()
                batch = session.step()
                self.active = len(session.active)
                self.max_batch = max(self.max_batch, len(batch))
                for h in self._handles(session):
                    h._emit()
        except BaseException as e:
            with self._lock:
                pending, self._pending, self._driving = self._pending, [], False
            for h in pending + (self._handles(session) if session else []):
                h._done(None, e)
            raise
        finally:
            self.active = 0
            if session is not None:
                session.close()

    def _drive_alone(self) -> bool:
        """No slot fits: serve the queue one generation at a time on the engine's decoder."""
        while True:
            with self._lock:
                if not self._pending:
                    self._driving = False
                    return False
                h = self._pending.pop(0)
            self._alone(h)
            if self.yield_to is not None and self.yield_to():
                with self._lock:
                    self._driving = again = bool(self._pending)
                return again

    def _alone(self, h: "Handle") -> None:
        if h.cancelled:
            h._done("cancelled")
            return
        self.alone += 1
        try:       # stop strings are the caller's (text_chunks): the engine sees only stop ids
            config = dataclasses.replace(h.config, stop=())
            for chunk in self.engine.generate(h.prompt, config, lambda: h.cancelled):
                if chunk.token_ids:
                    h._q.put(list(chunk.token_ids))
                if chunk.finish_reason is not None:
                    h.cached = chunk.stats.cached_tokens if chunk.stats else 0
                    h._done(chunk.finish_reason)
        except Exception as e:      # noqa: BLE001 - delivered to that caller
            h._done(None, e)

    @staticmethod
    def _handles(session: BatchSession) -> list["Handle"]:
        return [s.handle for s in session.seqs if getattr(s, "handle", None) is not None
                and not s.handle.finished]


class Handle:
    """A caller's view of one generation in a BatchRunner: iterate for token ids as they come
    (blocks); then finish_reason is set. cancel() ends it at the next step."""

    def __init__(self, prompt: list[int], config: GenerationConfig):
        self.prompt, self.config = prompt, config
        self.seq: Sequence | None = None
        self.finish_reason: str | None = None
        self.finished = False
        self.cancelled = False
        self.cached = 0                     # prompt tokens from the prefix cache (served alone)
        self._q: queue.Queue = queue.Queue()
        self._sent = 0

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "seq" and value is not None:
            value.handle = self

    @property
    def cached_tokens(self) -> int:
        return self.seq.cached_tokens if self.seq is not None else self.cached

    def cancel(self) -> None:
        self.cancelled = True

    def _emit(self) -> None:
        s = self.seq
        new = s.token_ids[self._sent:]
        if new:
            self._q.put(list(new))
            self._sent += len(new)
        if s.error is not None:
            self._done(None, s.error)
        elif s.finish_reason is not None:
            self._done(s.finish_reason)

    def _done(self, reason: str | None, error: BaseException | None = None) -> None:
        if self.finished:
            return
        self.finished, self.finish_reason = True, reason
        self._q.put(error if error is not None else None)

    def tokens(self, cancelled: Callable[[], bool] | None = None,
               poll_s: float = 0.05) -> Iterator[int]:
        """Token ids as they come. `cancelled` is checked while waiting (also while queued
        behind a full batch): once it is true the generation is cancelled and this returns."""
        while True:
            try:
                item = self._q.get(timeout=poll_s)
            except queue.Empty:
                if cancelled is not None and cancelled():
                    self.cancel()
                    return
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield from item

    def __iter__(self):
        return self.tokens()

    def result(self) -> list[int]:
        return list(self)


def text_chunks(engine: Engine, handle: Handle,
                cancelled: Callable[[], bool] | None = None) -> Iterator[Chunk]:
    """A Handle's tokens as Engine.generate's Chunks for that generation alone: the same text
    pieces (stop strings cut, text that may start one or an incomplete UTF-8 sequence held
    back), finish_reason and token counts. Closing the iterator early cancels the generation."""
    tok, config = engine.tokenizer, handle.config
    stream = TextStream(tok.decode if tok is not None else None, config.stop)
    t0 = time.perf_counter()
    finish = None

    def chunk(text: str, reason: str | None = None, stats: GenerationStats | None = None) -> Chunk:
        return Chunk(text, stream.take()[0], reason, stats)

    try:
        for token in handle.tokens(cancelled):
            piece = stream.push(token)
            if piece is not None:
                yield chunk(piece)
            if stream.stopped:
                finish = "stop"
                break
            if cancelled is not None and cancelled():
                finish = "cancelled"
                break
    finally:
        if finish is not None or not handle.finished:
            handle.cancel()                    # a stop string, or the caller closed us early
    finish = finish or handle.finish_reason or "cancelled"
    if finish == "length":
        rest = stream.rest()
        if rest is not None:
            yield chunk(rest)
    stats = GenerationStats(prompt_tokens=len(handle.prompt), cached_tokens=handle.cached_tokens,
                            generated_tokens=len(stream.ids),
                            measured_total_s=time.perf_counter() - t0)
    yield chunk("", finish, stats)
