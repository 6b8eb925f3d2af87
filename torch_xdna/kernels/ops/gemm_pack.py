"""Host layouts of GEMM weights as the array streams them, one contiguous tile per core and K
step (the tiling GemmDesign.plan chose; kernels/lower/gemm.py feeds them). Built once per weight,
like any weight repacking: by the blocks' host inputs (kernels/stages/llm_layer.py) and the
core-kernel references (kernels/aie/refs.py).
"""
from __future__ import annotations

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import quant
from torch_xdna.kernels.base import ceil_div


def pack_weight_tiles(d, gen: Generation, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Host layout of a weight-only GEMM's B: W [N, K] int8 (or packed int4 [N, K/2]) and its
    bf16 scales [N, K/g] as the array streams them, [n tile][k step][W tile | scale tile]
    bytes, zero-padded at the edges. Done once per weight (like any weight repacking), so each
    core receives its weights and their scales on one channel."""
    plan = d.plan(gen)
    tm, tk, tn = plan.tile
    gm, gn = plan.notes["grid"]
    N, K, g = d.n, d.k, d.w_group
    kt, nt = ceil_div(K, tk), ceil_div(N, tn)
    ntp = ceil_div(nt, gn) * gn
    per = 2 if d.dtype == "int4" else 1
    tkb = tk // per
    qb = q.contiguous().view(torch.uint8).reshape(N, -1)
    w = torch.zeros(ntp * tn, kt * tkb, dtype=torch.uint8)
    w[:N, :qb.shape[1]] = qb
    w = w.reshape(ntp, tn, kt, tkb).permute(0, 2, 1, 3).reshape(ntp, kt, tn * tkb)
    sg = max(1, tk // g)
    if tk >= g:
        s = torch.zeros(ntp * tn, kt * sg, dtype=torch.bfloat16)
        s[:N, :scales.shape[1]] = scales.to(torch.bfloat16)
    else:
        cols = torch.tensor([min(k * tk // g, K // g - 1) for k in range(kt)])
        s = torch.zeros(ntp * tn, kt, dtype=torch.bfloat16)
        s[:N] = scales.to(torch.bfloat16)[:, cols]
    s = s.reshape(ntp, tn, kt, sg).permute(0, 2, 1, 3).contiguous().view(torch.uint8)
    s = s.reshape(ntp, kt, tn * sg * 2)
    return torch.cat([w, s], dim=-1).reshape(-1).contiguous()


def pack_bfp16_tiles(d, gen: Generation, b: torch.Tensor) -> torch.Tensor:
    """Host layout of a bfp16 GEMM's B [.., K, N] (floats): per batch, [n tile][k step] tiles of
    B^T (tn rows of tk values) encoded as bfp16 blocks along K (quant.encode_bfp16), zero-padded
    at the edges; every tile is a whole number of 32-bit words."""
    plan = d.plan(gen)
    tm, tk, tn = plan.tile
    gm, gn = plan.notes["grid"]
    K, N = d.k, d.n
    kt, nt = ceil_div(K, tk), ceil_div(N, tn)
    ntp = ceil_div(nt, gn) * gn
    bt = b.float().reshape(-1, K, N).transpose(-1, -2)          # [batch, N, K]
    full = torch.zeros(bt.shape[0], ntp * tn, kt * tk)
    full[:, :N, :K] = bt
    enc = quant.encode_bfp16(full)                               # [batch, ntp*tn, kt*tk/8*9]
    kb = tk // 8 * 9
    enc = enc.reshape(-1, ntp, tn, kt, kb).permute(0, 1, 3, 2, 4)
    return enc.reshape(-1).contiguous()
