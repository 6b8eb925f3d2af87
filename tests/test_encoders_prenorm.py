"""ModernBERT (rotary, GeGLU, alternating local/global attention) and ESM-2 (rotary, protein
tokenizer, token dropout, per-residue outputs) through the real loading code: random-weight HF
directories written by transformers, compared with transformers on CPU (fp32 verification mode
within 1e-4 relative; the bf16 mode's error beside transformers' own bf16)."""
from __future__ import annotations

import shutil

import pytest
import torch

from torch_xdna.engine.embed.embedder import Embedder, default_model_dir
from torch_xdna.kernels.blocks.encoder_prenorm import rope_table

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog again and again",
         "a", "what is the capital of france? paris is. " * 3]
PROTEINS = ["MKTAYIAKQRQISFVKSHFSRQ", "GLSDGEWQQVLNVWGKVEAD", "M", "MKT<mask>YIA KQR",
            "ACDEFGHIKLMNPQRSTVWY" * 3]
ESM_VOCAB = ["<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO", ".", "-",
             "<null_1>", "<mask>"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import ModernBertConfig, ModernBertModel
    d = tmp_path_factory.mktemp("mb")
    cfg = ModernBertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=4,
                           num_attention_heads=4, intermediate_size=96,
                           max_position_embeddings=128, local_attention=8, pad_token_id=0,
                           cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102)
    torch.manual_seed(0)
    model = ModernBertModel(cfg).eval()
    with torch.no_grad():                       # norms away from 1 / 0 so a missed one shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.2)
    hf = d / "hf"
    model.save_pretrained(hf)
    shutil.copy(default_model_dir() / "tokenizer.json", hf / "tokenizer.json")
    st = SentenceTransformer(modules=[Transformer(str(hf), max_seq_length=64), Pooling(64)],
                             device="cpu")
    st.save(str(d / "st"))
    return d / "st", model, st


def test_modernbert_fp32_matches_transformers_and_sentence_transformers(modernbert_dir):
    d, model, st = modernbert_dir
    emb = Embedder.load(d, precision="fp32")
    try:
        a = emb.spec.arch
        assert a.windows == (0, 4, 4, 0) and a.thetas == (160000.0, 10000.0, 10000.0, 160000.0)
        assert a.gated and not a.first_attn_norm and emb.spec.pooling == "mean"
        # a 40-token text reaches past the 4-token window: local layers matter
        states = emb.token_states(TEXTS)
        for t, got in zip(TEXTS, states):
            ids = torch.tensor([emb.tokenizer.encode([t])[0]])
            with torch.no_grad():
                ref = model(ids).last_hidden_state[0]
            assert _rel(got, ref) <= 1e-4, (t, _rel(got, ref))
        ref = st.encode(TEXTS, convert_to_tensor=True).float()
        got = emb.embed(TEXTS)
        assert max(_rel(g, r) for g, r in zip(got, ref)) <= 1e-4
    finally:
        emb.close()


def test_modernbert_bf16_beside_transformers_bf16(modernbert_dir):
    d, model, st = modernbert_dir
    ref = st.encode(TEXTS, convert_to_tensor=True).float()
    theirs = st.to(torch.bfloat16).encode(TEXTS, convert_to_tensor=True).float()
    st.to(torch.float32)
    emb = Embedder.load(d)
    try:
        got = emb.embed(TEXTS)
    finally:
        emb.close()
    ours = max(_rel(g, r) for g, r in zip(got, ref))
    hf = max(_rel(g, r) for g, r in zip(theirs, ref))
    print(f"ModernBERT bf16 relative error: ours {ours:.2e}, transformers bf16 {hf:.2e}")
    assert ours <= max(3 * hf, 2e-2), (ours, hf)


@pytest.fixture(scope="module")
def esm_dir(tmp_path_factory):
    from transformers import EsmConfig, EsmModel, EsmTokenizer
    d = tmp_path_factory.mktemp("esm") / "esm2-tiny"
    d.mkdir()
    (d / "vocab.txt").write_text("\n".join(ESM_VOCAB) + "\n")
    tok = EsmTokenizer(str(d / "vocab.txt"))
    cfg = EsmConfig(vocab_size=len(ESM_VOCAB), hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=96, max_position_embeddings=130,
                    position_embedding_type="rotary", pad_token_id=1,
                    mask_token_id=ESM_VOCAB.index("<mask>"), token_dropout=True,
                    emb_layer_norm_before=False, hidden_act="gelu")
    torch.manual_seed(1)
    model = EsmModel(cfg, add_pooling_layer=False).eval()
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


def test_esm_tokenizer_matches_transformers(esm_dir):
    d, _, tok = esm_dir
    emb = Embedder.load(d, precision="fp32")
    try:
        for p in PROTEINS:
            assert emb.tokenizer.encode([p])[0] == tok(p)["input_ids"], p
    finally:
        emb.close()


def test_esm_per_residue_and_pooled_fp32(esm_dir):
    d, model, tok = esm_dir
    emb = Embedder.load(d, precision="fp32")
    try:
        assert emb.spec.arch.token_dropout and emb.spec.arch.first_attn_norm
        states = emb.token_states(PROTEINS)
        vecs = emb.embed(PROTEINS)
        for p, got, v in zip(PROTEINS, states, vecs):
            enc = tok(p, return_tensors="pt")
            with torch.no_grad():
                ref = model(**enc).last_hidden_state[0]
            assert got.shape == ref.shape and _rel(got, ref) <= 1e-4, (p, _rel(got, ref))
            mean = ref.mean(0)
            assert _rel(v, mean / mean.norm()) <= 1e-4
    finally:
        emb.close()


def test_esm_bf16_beside_transformers_bf16(esm_dir):
    d, model, tok = esm_dir
    emb = Embedder.load(d)
    try:
        states = emb.token_states(PROTEINS)
    finally:
        emb.close()
    import copy
    ours, hf = [], []
    mb = copy.deepcopy(model).to(torch.bfloat16)
    for p, got in zip(PROTEINS, states):
        enc = tok(p, return_tensors="pt")
        with torch.no_grad():
            ref = model(**enc).last_hidden_state[0]
            ref16 = mb(**enc).last_hidden_state[0].float()
        ours.append(_rel(got, ref))
        hf.append(_rel(ref16, ref))
    print(f"ESM-2 bf16 per-residue relative error: ours {max(ours):.2e}, "
          f"transformers bf16 {max(hf):.2e}")
    assert max(ours) <= max(3 * max(hf), 2e-2)


def test_rope_table_matches_transformers():
    from transformers import EsmConfig
    from transformers.models.esm.modeling_esm import EsmRotaryEmbedding
    cfg = EsmConfig(hidden_size=64, num_attention_heads=4, position_embedding_type="rotary")
    rot = EsmRotaryEmbedding(cfg)
    cos, sin = rot(torch.zeros(1), torch.arange(50)[None])
    c, s = rope_table(50, 16, 10000.0)
    assert torch.equal(c, cos[0]) and torch.equal(s, sin[0])


def test_served_modernbert_and_esm(modernbert_dir, esm_dir):
    import httpx
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    reg = ModelRegistry(max_models=2)
    reg.add_dir(modernbert_dir[0], name="mb")
    reg.add_dir(esm_dir[0], name="esm")
    want = {}
    for name, d, texts in (("mb", modernbert_dir[0], TEXTS[:2]), ("esm", esm_dir[0], PROTEINS[:2])):
        emb = Embedder.load(d)
        try:
            want[name] = (texts, emb.embed(texts))
        finally:
            emb.close()
    with BackgroundServer(create_app(ServerConfig(default_model=False), registry=reg)) as srv:
        for name, (texts, vecs) in want.items():
            r = httpx.post(srv.url + "/v1/embeddings", json={"model": name, "input": texts})
            assert torch.equal(torch.tensor([x["embedding"] for x in r.json()["data"]]), vecs)


def test_estimate_equals_what_the_simulator_charges(esm_dir):
    """engine/embed/estimate.py charges the Embedder's own Program: a 14-residue protein runs in
    the (1, 16) bucket, and the sim's modeled time of that run equals the estimate's."""
    from torch_xdna.engine.embed.embedder import EmbedStats
    from torch_xdna.engine.embed.estimate import estimate_encoder, modeled_ms
    d, _, _ = esm_dir
    from torch_xdna.hw import NPU4
    from torch_xdna.runtime.sim import SimDevice
    # a device of its own: the estimate is one cold run, and on the shared device whatever ran
    # before (other tests) would add a hardware-context switch
    emb = Embedder.load(d, device=SimDevice(NPU4, 1 << 30))
    try:
        stats = EmbedStats()
        emb.embed(["MKTAYIAKQRQI"], stats)               # 12 residues + <cls> + <eos>
        assert stats.shapes == [(1, 16)]
        want = modeled_ms(emb.spec, 16)
        assert want["launches"] == len(emb._workspace(1, 16).program.launches)
        assert abs(stats.modeled_us / 1e3 - want["modeled_npu_ms"]) <= 0.05 * want["modeled_npu_ms"]
    finally:
        emb.close()
    r = estimate_encoder("esm2-35m", [64, 4096], cpu=False)
    assert [x["seq"] for x in r["results"]] == [64, 1024]          # capped at max_seq_length
    assert 0 < r["results"][0]["modeled_npu_ms"] < r["results"][1]["modeled_npu_ms"]
    assert estimate_encoder("qwen3-0.6b", [64], cpu=False) is None
