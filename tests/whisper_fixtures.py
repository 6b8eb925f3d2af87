"""Random-weight Whisper directories for the ASR tests (built by the tests; nothing downloads).

Layout as a real Whisper checkpoint: text tokens first (a byte-level BPE trained here on a small
text), then <|endoftext|>, <|startoftranscript|>, language tokens, tasks, <|startofprev|>,
<|nospeech|>, <|notimestamps|> and the 1501 timestamp tokens <|0.00|>..<|30.00|>; a
generation_config.json with lang_to_id / task_to_id / suppress tokens as the hub's files have.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

TEXT = ("the meeting starts at nine. we discuss the budget, the plan and the next steps. "
        "please send the notes to everyone after the call. thanks, see you tomorrow! ") * 20
LANGS = ("en", "de", "fr")
SHAPES = {   # d_model, layers, heads, ffn (the real checkpoints' shapes; vocabulary reduced)
    "tiny": (384, 4, 6, 1536),
    "base": (512, 6, 8, 2048),
    "small": (768, 12, 12, 3072),
    "micro": (64, 2, 2, 128),
}


def specials() -> list[str]:
    return (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{c}|>" for c in LANGS]
            + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
               "<|nospeech|>", "<|notimestamps|>"]
            + [f"<|{i * 0.02:.2f}|>" for i in range(1501)])


def save_tokenizer(path: Path) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials()])
    tok.save(str(path / "tokenizer.json"))
    return {s: tok.token_to_id(s) for s in specials()}


def make_whisper_dir(path: Path, shape: str = "micro", seed: int = 0, init: float = 0.2,
                     layers: int | None = None) -> Path:
    """A WhisperForConditionalGeneration directory with random weights (`init`: the std of the
    weights; larger than the default so that logits are peaked, no near-ties in argmax)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    path.mkdir(parents=True, exist_ok=True)
    ids = save_tokenizer(path)
    vocab = max(ids.values()) + 1
    d, n, heads, ffn = SHAPES[shape]
    n = layers or n
    eos, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    cfg = WhisperConfig(vocab_size=vocab, d_model=d, encoder_layers=n, decoder_layers=n,
                        encoder_attention_heads=heads, decoder_attention_heads=heads,
                        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, num_mel_bins=80,
                        max_source_positions=1500, max_target_positions=448,
                        decoder_start_token_id=sot, eos_token_id=eos, pad_token_id=eos,
                        bos_token_id=eos, init_std=init, suppress_tokens=None,
                        begin_suppress_tokens=None)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():        # LayerNorms and biases random too, so every term is exercised
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    gen = {"decoder_start_token_id": sot, "eos_token_id": eos, "pad_token_id": eos,
           "bos_token_id": eos, "max_length": 448, "is_multilingual": True,
           "lang_to_id": {f"<|{c}|>": ids[f"<|{c}|>"] for c in LANGS},
           "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
           "no_timestamps_token_id": ids["<|notimestamps|>"], "max_initial_timestamp_index": 50,
           "suppress_tokens": [ids["<|startoflm|>"], ids["<|nospeech|>"], 7, 11],
           "begin_suppress_tokens": [220 if vocab > 220 else 1, eos]}
    (path / "generation_config.json").write_text(json.dumps(gen))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80, "n_fft": 400,
        "hop_length": 160, "chunk_length": 30, "n_samples": 480000, "sampling_rate": 16000,
        "padding_value": 0.0, "return_attention_mask": False}))
    return path


def tone(seconds: float, rate: int = 16000, seed: int = 0):
    """A test signal: two tones plus noise, float32."""
    import numpy as np
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1250 * t * (1 + t / 40))
    return (x + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
