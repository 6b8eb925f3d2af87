"""The LM head as the stages its array programs run (kernels/lower/llm_head.py), their host
layout and their functional order.

HeadDesign (blocks/llm.py) is one launch; on the array it runs as two stages wired through one
scratch DDR buffer:

  final_norm  rms_norm of row n - 1 of x (VectorDesign; the row is read at a per-launch BD
              offset, so a prefill chunk's head reads its last valid token)
                                                  x, final_norm -> T_h    bf16 [1, H]
  lm_head     GEMV (GemmDesign, the plan's tiles; the N edge of a large vocabulary moves back
              to end at N, ops/gemm.n_panel_start)
                                                  T_h, w_lm_t   -> logits f32  [1, V]

Host layout (once per weight, `host_inputs`): a bf16 lm_head as B = W^T [H, V]; int8 / int4 as
the GEMV stage's packed tiles (weights and scales per tile). `staged_reference` is the head's
functional reference in this order (the stages' own references: the rms_norm row op and
GemmDesign's K-tile order), so the transaction level and the emulated NPU are bit-identical to
it; numerics.layer_order() == "plan" makes the functional level run it (as for the layer).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from torch_xdna.kernels import numerics
from torch_xdna.kernels.stages.llm_layer import Stage, stage_weight
from torch_xdna.kernels.blocks.weights import STAGED_PRECISIONS, default_group, weight_tensors
from torch_xdna.kernels.ops.gemm import GemmDesign, UpstreamGemmDesign
from torch_xdna.kernels.ops.vector import VectorDesign

BF16, F32 = torch.bfloat16, torch.float32
INPUT_NAMES = ("x", "final_norm", "w_lm_t")
OUTPUT_NAMES = ("logits",)
SCRATCH = "T_h"


def unsupported(head, n: int | None = None) -> str | None:
    """Why this head does not run as stages (None: it does)."""
    rows = head.rows if n is None else n
    checks = ((head.precision not in STAGED_PRECISIONS,
               f"precision {head.precision} (stages lowered for {', '.join(STAGED_PRECISIONS)})"),
              (bool(head.softcap), "a logit softcap (no tanh stage lowered)"),
              (head.layer_norm, "a final LayerNorm (RMSNorm only)"),
              (not 0 < rows <= head.rows, f"{rows} valid rows of {head.rows}"))
    return next((why for bad, why in checks if bad), None)


def stages(head) -> tuple[Stage, Stage]:
    h, v = head.hidden, head.vocab
    norm = VectorDesign("rms_norm", ((1, h), (h,)), (F32, F32), (1, h), BF16,
                        (("eps", head.eps), ("has_weight", True),
                         ("weight_offset", float(head.norm_offset))))
    if head.precision == "bf16":
        gemv = UpstreamGemmDesign(1, h, v, dtype="bf16", out_dtype=F32)
    else:
        gemv = UpstreamGemmDesign(1, h, v, dtype=head.precision, out_dtype=F32,
                          w_group=head.group or default_group(head.precision))
    return (Stage("final_norm", "design", ("x", "final_norm"), (SCRATCH,), norm),
            Stage("lm_head", "design", (SCRATCH, "w_lm_t"), ("logits",), gemv))


def host_inputs(head, inputs: Sequence[torch.Tensor], gen=None) -> list[torch.Tensor]:
    """The head's inputs (x, final_norm, *w_lm) as the stages' host arguments (INPUT_NAMES):
    bf16 lm_head as W^T [H, V], int8 / int4 as the GEMV stage's packed tiles (for `gen`);
    derived once per weight (operands.OPERANDS, keyed by storage and version)."""
    x, norm, *ws = inputs[:2 + weight_tensors(head.precision)]
    return [x, norm, stage_weight(stages(head)[1].design, ws, gen)]


def staged_reference(head, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                     pos: int = 0, n: int | None = None, **_: Any) -> None:
    """HeadDesign's reference in the order its stage programs compute (see above)."""
    n = head.rows if n is None else int(n)
    x, norm, *ws = inputs[:2 + weight_tensors(head.precision)]
    norm_st, gemv_st = stages(head)
    h = torch.zeros((1, head.hidden), dtype=BF16)
    norm_st.design.reference([x.reshape(-1, head.hidden)[n - 1:n], norm], [h])
    gemv = gemv_st.design
    b = [numerics.operand(ws[0]).t()] if head.precision == "bf16" else list(ws)
    out = outputs[0]
    view = out.view(1, head.vocab) if out.is_contiguous() else out.reshape(1, head.vocab)
    gemv.reference([h, *b], [view])
