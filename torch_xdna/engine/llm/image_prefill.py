"""Prefill of a prompt holding images (Gemma 3): projected image rows in place of their
placeholder tokens, each image's block of rows attending bidirectionally.

A block must be prefilled in one chunk: a row of the block sees the block's later rows at every
layer. When the block is longer than the decoder's chunk (Gemma 3 4B: 256 soft tokens, while the
fused layer plans at most 128 rows on npu4, its MLP's staged activations being the limit), that
chunk runs "wide": the attention block over all the block's rows in one launch (it plans: it
streams K/V tiles), the MLP, which is row-wise, in launches of `chunk` rows over slices of the
rows. Same numerics as the layer design (it runs the same two block references).
"""
from __future__ import annotations

import torch

from torch_xdna.engine.llm.decoder import Decoder, step_designs
from torch_xdna.kernels.base import Design, round_up
from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.runtime import Launch, PlanError, Program, TensorArg


def chunk_cuts(total: int, chunk: int, spans: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(start, end, rows) prefill chunks over `total` tokens: at most `chunk` tokens, cut before
    a span (start, end) rather than through it; a span longer than `chunk` gets a wide chunk of
    its own, `rows` = the span rounded up to a multiple of `chunk` (rows = chunk otherwise)."""
    cuts, start = [], 0
    while start < total:
        wide = [b - a for a, b in spans if a == start and b - a > chunk]
        if wide:
            rows = round_up(wide[0], chunk)
            end = min(total, start + rows)
            cuts.append((start, end, rows))
            start = end
            continue
        end = min(start + chunk, total)
        for a, b in spans:
            if a < end < b:
                end = a
        cuts.append((start, end, chunk))
        start = end
    return cuts


def wide_designs(spec, policy, rows: int, chunk: int, capacity: int, with_head: bool,
                 kv_dtype: str) -> list[tuple[str, int, Design]]:
    """The launches of a wide image chunk of `rows` rows, in order: (role, layer, design), the
    MLP block (at `chunk` rows) once per slice. The engine's Program and the estimate use it."""
    mlps = {i: d for role, i, d in step_designs(spec, policy, chunk, capacity, False, "block",
                                                kv_dtype) if role == "mlp"}
    out: list[tuple[str, int, Design]] = []
    for role, i, d in step_designs(spec, policy, rows, capacity, with_head, "block", kv_dtype,
                                   images=True):
        out += [(role, i, mlps[i])] * (rows // chunk) if role == "mlp" else [(role, i, d)]
    return out


class ImageDecoder(Decoder):
    """A Decoder that also prefills image rows (forward_images)."""

    def _image_buffers(self, rows: int) -> None:
        """image_x / image_mask (and, past the chunk, wide x / ids) of at least `rows` rows."""
        have = getattr(self, "image_x", None)
        if have is not None and have.shape[0] >= rows:
            return
        rows = max(rows, self.chunk)
        h = self.spec.hidden
        self.image_x = self.empty((rows, h), torch.float32)
        self.image_mask = self.empty((rows, 1), torch.bool)
        if rows > self.chunk:
            self.wide_x = self.empty((rows, h), torch.float32)
            self.wide_ids = self.empty((rows,), torch.int32)
        self._programs = {k: p for k, p in self._programs.items() if k[0] != "wide"}

    def wide_program(self, rows: int, with_head: bool) -> Program:
        """A chunk of `rows` > chunk tokens holding an image block: per layer the attention block
        over all rows, then the MLP block over slices of `chunk` rows (scalars per slice)."""
        key = ("wide", rows, with_head)
        prog = self._programs.get(key)
        if prog is not None:
            return prog
        spec, s, c = self.spec, self._scalars, self.chunk
        x, ids = self.rows_view(self.wide_x, rows), self.rows_view(self.wide_ids, rows)
        self.slice_scalars = [{"pos": 0, "n": c} for _ in range(rows // c)]
        launches, k = [], 0
        for role, i, design in wide_designs(spec, self.policy, rows, c, self.capacity,
                                            with_head, self.kv_dtype):
            try:
                design.plan(self.dev.gen)
            except PlanError as e:
                raise ValueError(f"an image block of {rows} rows does not plan on "
                                 f"{self.dev.gen.name}: {e}") from None
            if role == "embed":
                launches.append(Launch(design, self.embed_inputs(ids), [x], s, op="embed"))
            elif role == "image_rows":
                ins = [self.rows_view(self.image_mask, rows), self.rows_view(self.image_x, rows), x]
                launches.append(Launch(design, ins, [x], s, op="image_rows"))
            elif role == "attention":
                launches.append(Launch(design, self.attention_inputs(x, i),
                                       [x, *self.cache.layer_outputs(self.kv_index[i])], s,
                                       op=f"layer{i}.attention"))
            elif role == "mlp":                  # slice k of the rows (k counts per layer)
                k = k + 1 if launches[-1].op.startswith(f"layer{i}.mlp") else 0
                xs = TensorArg(x.buffer, x.dtype, (c,) + x.shape[1:], x.strides,
                               x.offset + k * c * x.strides[0])
                launches.append(Launch(design, self.mlp_inputs(xs, i), [xs],
                                       self.slice_scalars[k], op=f"layer{i}.mlp{k}"))
            elif role == "head":
                launches.append(Launch(design, self.head_inputs(x), [self.logits], s, op="lm_head"))
            else:
                raise ValueError(f"a wide image chunk cannot run the {role} launches of "
                                 f"{spec.family}")
        prog = Program(launches, name=f"{spec.family}.prefill_image")
        self._programs[key] = prog
        return prog

    def forward_images(self, ids: list[int], rows: torch.Tensor, at: list[int],
                       spans: list[tuple[int, int]]) -> torch.Tensor:
        """forward(ids) where the tokens at indices `at` of ids take the fp32 `rows` [len(at),
        hidden] (image soft tokens) instead of their embeddings, and each (start, end) index
        range of `spans` attends bidirectionally (Gemma 3's image blocks). A chunk never cuts a
        span: a span longer than a chunk runs as one wide chunk (module docstring)."""
        pos0 = self.cache.length
        if pos0 + len(ids) > self.capacity:
            raise self.context_error(pos0 + len(ids))
        if rows.shape != (len(at), self.spec.hidden):
            raise ValueError(f"{len(at)} image positions need rows [{len(at)}, "
                             f"{self.spec.hidden}], got {list(rows.shape)}")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.vocab})")
        cuts = chunk_cuts(len(ids), self.chunk, spans)
        self._image_buffers(max(r for _, _, r in cuts))
        dev, s = self.dev, self._scalars
        row_of = {j: k for k, j in enumerate(at)}
        try:
            for start, end, width in cuts:
                n = end - start
                wide = width > self.chunk
                dev.write((self.wide_ids if wide else self.ids).buffer,
                          torch.tensor(ids[start:end], dtype=torch.int32))
                mine = [j for j in range(start, end) if j in row_of]
                if mine:
                    xs = torch.zeros(n, self.spec.hidden)
                    mask = torch.zeros(n, 1, dtype=torch.bool)
                    for j in mine:
                        xs[j - start], mask[j - start] = rows[row_of[j]], True
                    dev.write(self.image_x.buffer, xs)
                    dev.write(self.image_mask.buffer, mask)
                s["pos"], s["n"] = pos0 + start, n
                s["spans"] = tuple((pos0 + a, pos0 + b) for a, b in spans if start <= a < end)
                last = end == len(ids)
                if wide:
                    prog = self.wide_program(width, last)
                    for k, sc in enumerate(self.slice_scalars):
                        sc["pos"] = pos0 + start + k * self.chunk
                        sc["n"] = max(0, min(self.chunk, n - k * self.chunk))
                else:
                    prog = self.program(rows_bucket(n, self.chunk), last, bool(mine))
                dev.run_program(prog)
                self.cache.length = pos0 + end
        finally:
            s.pop("spans", None)
        return dev.download(self.logits)[0]
