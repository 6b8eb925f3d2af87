"""BERT-family cross-encoders (rerankers): a *ForSequenceClassification directory as data.

A cross-encoder reads "[CLS] query [SEP] document [SEP]" (token types 0 then 1) and scores the
pair: logit = W_c tanh(W_p h_CLS + b_p) + b_c (BertForSequenceClassification: the pooler, then the
classifier). The score is activation(logit), with the activation sentence-transformers'
CrossEncoder would pick: config.json's sentence_transformers.activation_fn (or the pre-v4 key
sbert_ce_default_activation_function), else Sigmoid for a single label. Multi-label heads (NLI)
are not relevance models and are refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from torch_xdna.models.encoder import (EncoderSpec, EncoderTokenizer, load_encoder_weights,
                                       transformer_dir)
from torch_xdna.models.hf import ModelDirError, iter_tensors, read_config

ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.Sigmoid": "sigmoid",
               "torch.nn.modules.linear.Identity": "identity", "torch.nn.Identity": "identity"}
HEAD_NAMES = {"pool_w": "pooler.dense.weight", "pool_b": "pooler.dense.bias",
              "cls_w": "classifier.weight", "cls_b": "classifier.bias"}


def is_cross_encoder(cfg: dict) -> bool:
    """True for a BERT config whose architecture is a sequence classifier."""
    archs = cfg.get("architectures") or []
    return any(str(a).endswith("ForSequenceClassification") for a in archs)


def is_cross_encoder_dir(model_dir: str | Path) -> bool:
    return is_cross_encoder(read_config(transformer_dir(model_dir)))


@dataclass(frozen=True)
class HeadSpec:
    """The scoring head: labels (always 1 here) and the activation applied to the logit."""

    labels: int
    activation: str          # "sigmoid" | "identity"


def load_head_spec(model_dir: str | Path) -> HeadSpec:
    tdir = transformer_dir(model_dir)
    cfg = read_config(tdir)
    if not is_cross_encoder(cfg):
        raise ModelDirError(f"{tdir}/config.json: architectures {cfg.get('architectures')!r} is not a "
                            "sequence classifier; a reranker needs a *ForSequenceClassification "
                            "cross-encoder (e.g. cross-encoder/ms-marco-MiniLM-L6-v2)")
    labels = int(cfg.get("num_labels") or len(cfg.get("id2label") or {0: 0}))
    if labels != 1:
        raise ModelDirError(f"{tdir}/config.json: {labels} labels; a reranker scores with one "
                            "relevance label (multi-label heads such as NLI are not rerankers)")
    st = cfg.get("sentence_transformers") or {}
    path = st.get("activation_fn") or cfg.get("sbert_ce_default_activation_function")
    if path is None:
        act = "sigmoid"
    elif path in ACTIVATIONS:
        act = ACTIVATIONS[path]
    else:
        raise ModelDirError(f"{tdir}/config.json: activation_fn {path!r} not supported "
                            f"(supported: {', '.join(sorted(set(ACTIVATIONS)))})")
    return HeadSpec(labels, act)


def load_head_weights(model_dir: str | Path, spec: EncoderSpec, head: HeadSpec
                      ) -> dict[str, torch.Tensor]:
    """pool_w [H,H], pool_b [H], cls_w [L,H], cls_b [L] (HF nn.Linear layout), shape-checked."""
    wanted = {hf: key for key, hf in HEAD_NAMES.items()}
    found: dict[str, torch.Tensor] = {}
    for name, t in iter_tensors(transformer_dir(model_dir)):
        short = name.removeprefix("bert.")
        if short in wanted:
            found[wanted[short]] = t
    missing = [hf for hf, key in wanted.items() if key not in found]
    if missing:
        raise ModelDirError(f"{model_dir}: cross-encoder head weights missing: {', '.join(missing)}")
    h, n = spec.hidden, head.labels
    shapes = {"pool_w": (h, h), "pool_b": (h,), "cls_w": (n, h), "cls_b": (n,)}
    for key, exp in shapes.items():
        if tuple(found[key].shape) != exp:
            raise ModelDirError(f"{model_dir}: tensor {HEAD_NAMES[key]} has shape "
                                f"{tuple(found[key].shape)}, config.json implies {exp}")
    return found


def load_cross_encoder_weights(model_dir: str | Path, spec: EncoderSpec, head: HeadSpec
                               ) -> dict[str, torch.Tensor]:
    return {**load_encoder_weights(model_dir, spec), **load_head_weights(model_dir, spec, head)}


class PairTokenizer:
    """(query, document) -> (ids, token types) as the HF tokenizer makes them for a pair, cut to
    max_seq_length with the 'longest_first' strategy (what CrossEncoder's tokenizer call does)."""

    def __init__(self, model_dir: str | Path, spec: EncoderSpec):
        base = EncoderTokenizer(model_dir, spec)
        self.spec = spec
        self._tok = base._tok
        self._prep = base._prep
        self._tok.enable_truncation(spec.max_seq_length, strategy="longest_first")

    def encode_pairs(self, query: str, docs: list[str]) -> list[tuple[list[int], list[int]]]:
        q = self._prep(query)
        encs = self._tok.encode_batch([(q, self._prep(d)) for d in docs])
        return [(e.ids, e.type_ids) for e in encs]
