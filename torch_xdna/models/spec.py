"""DecoderSpec: one data type describing every supported decoder-only LLM family.

The engine reads only this spec (never a family name), so a new family is a new spec builder and a
weight-name map in models/families.py, not new engine code. Differences between families are
fields: QK-norm, the (1+w) RMSNorm convention, embedding scale, per-layer sliding windows and RoPE
tables, sandwich norms, activation, soft-capping.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


class UnsupportedModelError(ValueError):
    """A config asks for a feature the engine does not implement (named in the message)."""


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding parameters of one table (types: default, linear, llama3, yarn, freq_factors:
    per-pair divisors of the inverse frequencies, as GGUF files store Llama 3 scaling;
    proportional: Gemma 4's p-RoPE, the first `partial` of the pairs rotate, the rest get
    frequency 0, i.e. pass through, over the whole head).

    Frequencies are computed in fp32 in transformers' order (modeling_rope_utils), so the cos/sin
    tables match its rotary embedding bit for bit (tests/test_rope_scaling.py): at 32K+
    positions one ulp of a frequency moves the angle by ~1e-3 rad."""

    theta: float
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    freq_factors: tuple[float, ...] = ()
    beta_fast: float = 32.0            # yarn: rotations bounding the extrapolated band
    beta_slow: float = 1.0             # yarn: rotations bounding the interpolated band
    attention_factor: float = 1.0      # yarn: cos/sin scale (0.1 ln(factor) + 1 by default)
    truncate: bool = True              # yarn: round the correction range to whole dimensions
    partial: float = 1.0               # proportional: share of the pairs that rotate

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """Per-pair inverse frequencies [head_dim/2] (fp32, as transformers computes them)."""
        base = self.theta
        pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        inv = 1.0 / pos_freqs
        if self.type == "default":
            return inv
        if self.type == "linear":
            return inv / self.factor
        if self.type == "proportional":        # transformers' _compute_proportional_rope_parameters
            angles = int(self.partial * head_dim // 2)
            rot = 1.0 / base ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / head_dim)
            return torch.cat([rot, torch.zeros(head_dim // 2 - angles)]) / self.factor
        if self.type == "freq_factors":
            if len(self.freq_factors) != len(inv):
                raise UnsupportedModelError(f"rope freq_factors has {len(self.freq_factors)} "
                                            f"entries for head_dim {head_dim} ({len(inv)} needed)")
            return inv / torch.tensor(self.freq_factors, dtype=torch.float32)
        if self.type == "llama3":
            # wavelengths longer than the original context are stretched by `factor`, short ones
            # kept, and the band between them interpolated smoothly (Llama 3.1 long-context recipe)
            low_wavelen = self.original_max_positions / self.low_freq_factor
            high_wavelen = self.original_max_positions / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = ((self.original_max_positions / wavelen - self.low_freq_factor)
                      / (self.high_freq_factor - self.low_freq_factor))
            blended = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
            return torch.where(medium, blended, scaled)
        if self.type == "yarn":
            # YaRN: high-frequency pairs extrapolate (unchanged), low-frequency pairs interpolate
            # (divided by factor), a linear ramp over the dimensions between beta_fast and
            # beta_slow rotations within the original context blends the two
            def corr_dim(rot: float) -> float:
                return (head_dim * math.log(self.original_max_positions / (rot * 2 * math.pi))
                        / (2 * math.log(base)))
            low, high = corr_dim(self.beta_fast), corr_dim(self.beta_slow)
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, head_dim - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
            extra = 1 - ramp
            return (1.0 / (self.factor * pos_freqs)) * (1 - extra) + inv * extra
        raise UnsupportedModelError(f"rope type {self.type!r} is not implemented")

    def tables(self, head_dim: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables [positions, head_dim] (halves duplicated, rotate-half convention),
        scaled by attention_factor (yarn) as transformers scales them."""
        inv = self.inv_freq(head_dim).float()
        freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        if self.attention_factor != 1.0:
            return emb.cos() * self.attention_factor, emb.sin() * self.attention_factor
        return emb.cos(), emb.sin()


@dataclass(frozen=True)
class WeightNames:
    """HF tensor names per canonical site; layer names contain '{i}'. Empty = absent."""

    embed: str
    final_norm: str
    lm_head: str
    attn_norm: str
    q: str
    k: str
    v: str
    o: str
    mlp_norm: str
    gate: str
    up: str
    down: str
    q_norm: str = ""
    k_norm: str = ""
    attn_post_norm: str = ""      # Gemma: post_attention_layernorm (before the residual add)
    mlp_post_norm: str = ""       # Gemma: post_feedforward_layernorm
    router: str = ""              # mixture of experts: the router (gate) [experts, H]
    expert_gate: str = ""         # per expert ('{e}'): gate_proj [I_e, H], up_proj, down_proj
    expert_up: str = ""
    expert_down: str = ""
    pos_embed: str = ""           # learned absolute positions (OPT) [positions + offset, H]
    # biases (linear_bias / LayerNorm families); q/k/v biases are fused like their weights
    attn_norm_bias: str = ""
    q_bias: str = ""
    k_bias: str = ""
    v_bias: str = ""
    o_bias: str = ""
    mlp_norm_bias: str = ""
    up_bias: str = ""
    down_bias: str = ""
    final_norm_bias: str = ""
    # gated DeltaNet (linear attention) layers: the input projections (fused in load order
    # qkv, z, b, a), the causal conv, dt bias, A_log, the gated norm, the output projection
    lin_qkv: str = ""
    lin_z: str = ""
    lin_b: str = ""
    lin_a: str = ""
    lin_conv: str = ""
    lin_dt: str = ""
    lin_alog: str = ""
    lin_norm: str = ""
    lin_out: str = ""
    # Gemma 4: per-layer inputs (PLE: a second embedding table [V, L*P], a projection of the
    # embeddings [L*P, H] and its norm [P]; per layer a gate [P, H], a projection [H, P] and a
    # post norm [H]) and a per-layer output scalar [1]
    ple_embed: str = ""
    ple_proj: str = ""
    ple_proj_norm: str = ""
    ple_gate: str = ""
    ple_out: str = ""
    ple_norm: str = ""
    layer_scalar: str = ""


@dataclass(frozen=True)
class DecoderSpec:
    """Shapes and conventions of a decoder-only transformer, as the engine consumes them."""

    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    rms_eps: float
    act: str                               # "silu" | "gelu_tanh"
    tie_embeddings: bool
    attn_scale: float                      # multiplies q k^T
    names: WeightNames
    ropes: dict = field(default_factory=dict)            # table name -> RopeSpec
    layer_rope: tuple[str, ...] = ()                      # per layer: which table
    layer_window: tuple[int | None, ...] = ()             # per layer: sliding window or None
    qk_norm: bool = False
    norm_offset: float = 0.0               # Gemma RMSNorm multiplies by (1 + w)
    embed_scale: float = 1.0               # Gemma multiplies embeddings by sqrt(hidden)
    sandwich_norms: bool = False           # Gemma: post-attention and post-feedforward norms
    final_softcap: float | None = None
    attn_softcap: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # mixture of experts (0 experts: dense). A MoE layer's MLP is a router over `experts` gated
    # MLPs of width `expert_intermediate`, of which `experts_per_token` run per token, their
    # outputs weighted by the softmax router probabilities (renormalized over the chosen ones
    # when norm_topk_prob). moe_layers: per layer, MoE (True) or the dense MLP (False).
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[bool, ...] = ()

    # OPT-style blocks: LayerNorm with a bias instead of RMSNorm, biases on every projection,
    # a non-gated MLP (up -> act -> down), learned absolute positions (table row = position +
    # position_offset) instead of RoPE (then `ropes` is empty)
    layer_norm: bool = False
    linear_bias: bool = False
    gated_mlp: bool = True
    learned_positions: int = 0             # rows of the position table (0: RoPE)
    position_offset: int = 0
    # hybrid models (Qwen3.5): per layer "attention" or "linear" (gated DeltaNet: a recurrent
    # state [v_heads, k_dim, v_dim] per layer, no KV cache); empty = every layer attention
    layer_kinds: tuple[str, ...] = ()
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv: int = 0                   # causal conv kernel over the q/k/v channels
    attn_output_gate: bool = False         # attention output times sigmoid(gate) (Qwen3.5)
    rotary_dim: int = 0                    # partial RoPE: the first rotary_dim dims (0: all)
    # Gemma 4: layers differ in shape and some reuse another layer's KV. Per layer (empty: the
    # global value): head dim, KV heads, MLP width, and the layer whose KV cache it attends over
    # (itself, or an earlier layer of its type: it then has no k/v projections and writes no KV)
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    layer_intermediate: tuple[int, ...] = ()
    kv_source: tuple[int, ...] = ()
    v_norm: bool = False                   # values RMS-normalized (no weight) before caching
    k_eq_v: bool = False                   # full-attention layers: v = k projection (no v_proj)
    per_layer_dim: int = 0                 # PLE width P per layer (0: none)
    per_layer_vocab: int = 0               # rows of the PLE table
    layer_scale: bool = False              # each layer's output times its stored scalar
    ignored_weights: tuple[str, ...] = ()  # name prefixes the engine does not use (vision/audio)
    # non-empty: the engine models this family's shapes (`xdna estimate`) but cannot run it;
    # the reason names what is missing (models/loader.read_model refuses with it)
    run_refusal: str = ""

    def is_linear(self, layer: int) -> bool:
        return bool(self.layer_kinds) and self.layer_kinds[layer] == "linear"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers holding a KV cache (every layer but the linear-attention ones)."""
        return tuple(i for i in range(self.layers) if not self.is_linear(i))

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the linear layers' causal conv: q, k (k_heads x k_dim each) and v."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    def head_dim_at(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def kv_heads_at(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.kv_heads

    def intermediate_at(self, layer: int) -> int:
        return self.layer_intermediate[layer] if self.layer_intermediate else self.intermediate

    def kv_owner(self, layer: int) -> int:
        """The layer whose KV cache `layer` attends over (itself unless its KV is shared)."""
        return self.kv_source[layer] if self.kv_source else layer

    def kv_shared(self, layer: int) -> bool:
        return self.kv_owner(layer) != layer

    def has_v(self, layer: int) -> bool:
        """The layer has its own v_proj (not KV-shared, not a k=v full-attention layer)."""
        return not self.kv_shared(layer) and not (self.k_eq_v and self.layer_window[layer] is None)

    @property
    def cache_layers(self) -> tuple[int, ...]:
        """The layers holding their own KV cache (attention layers whose KV is not shared)."""
        return tuple(i for i in self.attention_layers if not self.kv_shared(i))

    @property
    def per_layer_shapes(self) -> bool:
        """Layers of different shapes, shared KV or per-layer inputs (Gemma 4): the paths that
        assume one layer shape (batched decode, the block layout) decline such a model."""
        return bool(self.layer_head_dims or self.layer_kv_heads or self.layer_intermediate
                    or self.kv_source or self.per_layer_dim or self.layer_scale)

    def kv_elems_per_token(self) -> int:
        """K and V elements one cached position takes over every cache-holding layer."""
        return sum(2 * self.kv_heads_at(i) * self.head_dim_at(i) for i in self.cache_layers)

    def rope_dim(self, table: str) -> int:
        """The head dim a RoPE table is built for: its layers' (rotary_dim when partial)."""
        dims = {self.head_dim_at(i) for i, t in enumerate(self.layer_rope) if t == table}
        if len(dims) > 1:
            raise UnsupportedModelError(f"rope table {table!r} serves head dims {sorted(dims)}")
        return self.rotary_dim or (dims.pop() if dims else self.head_dim)

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def params(self, active: bool = False) -> int:
        """Parameter count (embeddings counted once when tied). active=True: a MoE layer counts
        only the experts one token runs (and its router)."""
        h, hq = self.hidden, self.heads

        def attn(i: int) -> int:
            q = hq * self.head_dim_at(i)
            kv = (1 + self.has_v(i)) * self.kv_heads_at(i) * self.head_dim_at(i)
            return h * (q * (2 if self.attn_output_gate else 1) + (0 if self.kv_shared(i) else kv)) + q * h
        vd, hv = self.linear_v_heads * self.linear_v_dim, self.linear_v_heads
        lin = (h * (self.linear_conv_dim + vd + 2 * hv) + vd * h
               + self.linear_conv_dim * self.linear_conv)
        experts = self.experts_per_token if active else self.experts
        moe = self.experts * h + experts * 3 * h * self.expert_intermediate
        mlps = sum(moe if self.is_moe(i) else
                   (3 if self.gated_mlp else 2) * h * self.intermediate_at(i)
                   for i in range(self.layers))
        head = 0 if self.tie_embeddings else self.vocab * h
        mixers = sum(lin if self.is_linear(i) else attn(i) for i in range(self.layers))
        p, lp = self.per_layer_dim, self.layers * self.per_layer_dim
        ple = (self.per_layer_vocab * lp + lp * h + 2 * self.layers * p * h) if p else 0
        return (mixers + mlps + self.vocab * h + head + ple
                + self.learned_positions * self.hidden)
