"""HF models with the model on the `xdna` device: eager op by op vs torch.compile(backend="xdna").

Per forward (tiny random-weight configs plus the whisper-base shape; nothing downloaded):
launches, dispatches and modeled NPU time (simulator cost model: MODELED, not measured on
hardware) from torch.xdna.counters(), plus the compiled graph's partitions and host nodes and the
eager fallback count. Models whose conv front end needs torch_xdna.kernels.ops.conv are skipped
without it.
`python benchmarks/bench_compile_models.py [--json PATH] [--only gpt2,t5_encoder]`
(`--only whisper_base`: a few minutes on a 2-core host, most of it the eager pass).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import warnings

import torch


def models() -> dict:
    """name -> (builder returning (model, inputs), needs conv designs)."""
    import transformers as T

    def ids(s=8):
        return torch.randint(0, 100, (2, s))

    def gpt2(head):
        cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64,
                           bos_token_id=0, eos_token_id=0)
        return (T.GPT2LMHeadModel if head else T.GPT2Model)(cfg), {"input_ids": ids(),
                                                                   "use_cache": False}

    def t5(gen):
        cfg = T.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=100,
                         decoder_start_token_id=0)
        if gen:
            return T.T5ForConditionalGeneration(cfg), {"input_ids": ids(), "use_cache": False,
                                                       "decoder_input_ids": ids(5)}
        return T.T5EncoderModel(cfg), {"input_ids": ids()}

    def bert():
        cfg = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, vocab_size=100, max_position_embeddings=64)
        return T.BertModel(cfg), {"input_ids": ids()}

    def whisper():
        cfg = T.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=1,
                              encoder_attention_heads=2, decoder_attention_heads=2,
                              encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
                              max_source_positions=16, vocab_size=100, pad_token_id=0,
                              bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
        return T.WhisperModel(cfg).get_encoder(), {"input_features": torch.randn(1, 8, 32)}

    def whisper_base():
        """whisper-base shape (6 + 6 layers, d_model 512, 80 mels x 3,000 frames): the front-end
        convs do not fit one mem-tile band and are time-tiled (compiler/lower_conv.py)."""
        cfg = T.WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6,
                              encoder_attention_heads=8, decoder_attention_heads=8,
                              encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_mel_bins=80,
                              max_source_positions=1500, max_target_positions=448,
                              vocab_size=51865)
        return T.WhisperForConditionalGeneration(cfg), {
            "input_features": torch.randn(1, 80, 3000), "use_cache": False,
            "decoder_input_ids": torch.tensor([[50258, 50259, 50359, 50363, 440, 1203]])}

    def vit():
        cfg = T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, image_size=16, patch_size=8, num_channels=3)
        return T.ViTModel(cfg, add_pooling_layer=False), {"pixel_values": torch.randn(1, 3, 16, 16)}

    def resnet18():
        cfg = T.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                             depths=[2, 2, 2, 2], layer_type="basic")
        return T.ResNetModel(cfg), {"pixel_values": torch.randn(1, 3, 64, 64)}

    return {"bert": (bert, False), "gpt2": (lambda: gpt2(False), False),
            "gpt2_lm": (lambda: gpt2(True), False), "t5_encoder": (lambda: t5(False), False),
            "t5_generation": (lambda: t5(True), False), "whisper_encoder": (whisper, True),
            "whisper_base": (whisper_base, True),
            "vit": (vit, True), "resnet18_64px": (resnet18, True)}


def _per_forward(fn) -> dict:
    from torch_xdna.runtime import get_device
    dev = get_device()
    fn()                                   # warm: designs configured, weights resident
    c0 = (dev.counters.launches, dev.counters.dispatches, dev.counters.modeled_us)
    fn()
    c = dev.counters
    return {"launches": c.launches - c0[0], "dispatches": c.dispatches - c0[1],
            "modeled_npu_us": round(c.modeled_us - c0[2], 1)}


def run(only: list[str] | None = None) -> dict:
    import torch_xdna  # noqa: F401  registers the device
    from torch_xdna.compiler import backend as B
    from torch_xdna.device import fallback
    has_conv = importlib.util.find_spec("torch_xdna.kernels.ops.conv") is not None
    out = {}
    for name, (build, conv) in models().items():
        if only and name not in only:
            continue
        if conv and not has_conv:
            out[name] = {"skipped": "needs torch_xdna.kernels.ops.conv"}
            continue
        torch.manual_seed(0)
        torch._dynamo.reset()
        m, kw = build()
        m = m.eval().to("xdna")
        kw = {k: v.to("xdna") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fallback.reset()
            with fallback.policy("silent"):
                eager = _per_forward(lambda: m(**kw))
            eager["fallbacks"] = sum(fallback.report().values())
            fallback.reset()
            c = torch.compile(m, backend="xdna", options={"cache": False})
            compiled = _per_forward(lambda: c(**kw))
        s = B.HISTORY[-1]
        compiled.update(partitions=s.partitions, host_nodes=s.nodes_host,
                        logged_us=round(s.modeled_us, 1), fallbacks=sum(fallback.report().values()))
        out[name] = {"eager": eager, "compiled": compiled}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--only", help="comma-separated model names")
    a = ap.parse_args()
    res = run(a.only.split(",") if a.only else None)
    print(f"{'model':16} {'eager launches/dispatches/us':>32} {'compiled launches/dispatches/us':>34}"
          f" {'parts':>5} {'host':>4} {'eager fallbacks':>15}")
    for name, r in res.items():
        if "skipped" in r:
            print(f"{name:16} skipped: {r['skipped']}")
            continue
        e, c = r["eager"], r["compiled"]
        print(f"{name:16} {e['launches']:>10} {e['dispatches']:>8} {e['modeled_npu_us']:>12.1f}"
              f" {c['launches']:>10} {c['dispatches']:>8} {c['modeled_npu_us']:>12.1f}"
              f" {c['partitions']:>5} {c['host_nodes']:>4} {e['fallbacks']:>15}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
