"""Random-weight Parakeet (FastConformer) directories for the ASR tests, built here (nothing
downloads): ParakeetForCTC or ParakeetForTDT from transformers' configs at small dims, saved with
save_pretrained, plus the ParakeetFeatureExtractor's preprocessor_config.json and a tokenizer.json
built locally (a SentencePiece-style Unigram over characters with the Metaspace "▁", as NVIDIA's
checkpoints have; the CTC blank "<pad>" is the last id, as in nvidia/parakeet-ctc-*).
"""
from __future__ import annotations

from pathlib import Path

import torch

LETTERS = "abcdefghijklmnopqrstuvwxyz'"
SHAPES = {   # hidden, layers, heads, ffn, subsampling channels (TDT-0.6B: 1024, 24, 8, 4096, 256)
    "micro": (64, 2, 4, 128, 16),
    "small": (128, 3, 4, 256, 32),
    "tdt-0.6b-2l": (1024, 2, 8, 4096, 256),     # Parakeet-TDT-0.6B's dims, 2 of its 24 layers
}


def pieces() -> list[str]:
    """The vocabulary: unk, then "▁x" and "x" for every letter (ids follow the list)."""
    return ["<unk>"] + [f"▁{c}" for c in LETTERS] + list(LETTERS) + ["▁"]


def save_tokenizer(path: Path) -> int:
    """tokenizer.json (+ the ParakeetTokenizer's config); returns the blank (pad) id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = [(p, -float(i % 7) - 1.0) for i, p in enumerate(pieces())]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens([AddedToken("<pad>", special=True)])
    blank = tok.token_to_id("<pad>")
    try:
        from transformers import ParakeetTokenizer
        ParakeetTokenizer(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>"
                          ).save_pretrained(path)
    except Exception:                       # transformers absent: the bare tokenizer.json
        tok.save(str(path / "tokenizer.json"))
    return blank


def make_parakeet_dir(path: Path, shape: str = "micro", head: str = "ctc", seed: int = 0,
                      n_mels: int = 80, init: float = 0.1) -> Path:
    """A ParakeetForCTC (head="ctc") or ParakeetForTDT (head="tdt") directory with random
    weights; LayerNorm / BatchNorm statistics and biases random too, so every term counts."""
    from transformers import (ParakeetCTCConfig, ParakeetFeatureExtractor, ParakeetForCTC,
                              ParakeetForTDT, ParakeetTDTConfig)
    path.mkdir(parents=True, exist_ok=True)
    blank = save_tokenizer(path)
    h, n, heads, ffn, ch = SHAPES[shape]
    enc = dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=heads,
               intermediate_size=ffn, subsampling_conv_channels=ch, num_mel_bins=n_mels,
               conv_kernel_size=9, initializer_range=init)
    if head == "ctc":
        cfg = ParakeetCTCConfig(vocab_size=blank + 1, pad_token_id=blank, encoder_config=enc)
        cls = ParakeetForCTC
    else:
        cfg = ParakeetTDTConfig(vocab_size=blank + 1, blank_token_id=blank, pad_token_id=blank,
                                decoder_hidden_size=48, num_decoder_layers=2,
                                durations=[0, 1, 2, 3, 4], encoder_config=enc)
        cls = ParakeetForTDT
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "subsampling" in name:         # frame-dependent stem output, not its biases
                p.mul_(4.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.1)
                m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)
        if head == "ctc":        # frame-dependent logits dominate the biases: many tokens
            model.ctc_head.weight.mul_(5.0)
            model.ctc_head.bias.zero_()
        else:                    # tokens and blanks vary; durations mostly 1-2 frames
            w, b, v = model.joint.head.weight, model.joint.head.bias, blank + 1
            w[:v].mul_(5.0)
            b.zero_()
            b[blank] = 1.0
            b[v:] = torch.tensor([-1.0, 1.0, 1.0, 0.0, 0.0])
    model.save_pretrained(path)
    ParakeetFeatureExtractor(feature_size=n_mels).save_pretrained(path)
    return path
