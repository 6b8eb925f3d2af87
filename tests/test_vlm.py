"""Vision-language chat (Gemma 3): a tiny random-weight Gemma3ForConditionalGeneration directory
against transformers: the processor's token layout and pixels, greedy tokens of an image prompt
in the fp32 verification mode, the bidirectional image blocks, the device tower's rows."""
from __future__ import annotations


import pytest
import torch

from vlm_fixtures import IMAGE, MM_TOKENS, build_vlm, hf_greedy_image, hf_pixels, sample_image

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3-vlm")
    return path, build_vlm(path)


def messages(img, text="what is this?"):
    return [{"role": "system", "content": "be brief."},
            {"role": "user", "content": [{"type": "image", "image": img},
                                         {"type": "text", "text": text}]}]


def test_prompt_matches_gemma3_processor(vlm):
    from transformers import AutoProcessor
    from torch_xdna.engine.llm.vlm import load_vlm
    path, _ = vlm
    eng = load_vlm(path, "fp32", max_context=128, prefix_cache=0)
    try:
        img = sample_image()
        ids = eng.encode_prompt(messages(img))
        text = eng.tokenizer.apply_chat_template(
            [{**m, "content": [{"type": p["type"], "text": p.get("text")} for p in m["content"]]}
             if isinstance(m["content"], list) else m for m in messages(img)])
        ref = AutoProcessor.from_pretrained(path)(text=text, images=[img], return_tensors="pt")
        assert list(ids) == ref["input_ids"][0].tolist()
        assert ids.count(IMAGE) == MM_TOKENS
        assert torch.equal(torch.from_numpy(ids.images[0])[None], ref["pixel_values"])
    finally:
        eng.close()


def test_greedy_identical_fp32(vlm):
    """prompt + 32 greedy tokens identical to transformers (fp32 verification mode); the image
    sits where the sliding window (8) and the bidirectional block both matter."""
    from torch_xdna.engine.llm.generate import GenerationConfig
    from torch_xdna.engine.llm.vlm import load_vlm
    path, model = vlm
    eng = load_vlm(path, "fp32", max_context=128, prefix_cache=0)
    try:
        img = sample_image()
        ids = eng.encode_prompt(messages(img))
        r = eng.complete(ids, GenerationConfig(max_tokens=32, stop_token_ids=()))
        assert r.token_ids == hf_greedy_image(model, list(ids), hf_pixels(img), 32)
    finally:
        eng.close()


def test_prefill_logits_and_bidirectional_blocks(vlm):
    """The last prefill logits equal transformers' with its token_type_ids (bidirectional image
    block) within 1e-4 and differ from its causal-only logits: the block mask matters here.
    A prefill chunk is cut before the image block, never through it; a block longer than the
    chunk runs as one wide chunk (attention over the block, the MLP in chunk-row slices)."""
    from torch_xdna.engine.llm.vlm import load_vlm
    from vlm_fixtures import hf_pixels
    path, model = vlm
    img = sample_image()
    x = None
    for chunk in (MM_TOKENS, 128, 3):     # the block fills a chunk; one chunk; a wide chunk
        eng = load_vlm(path, "fp32", max_context=128, prefix_cache=0, prefill_chunk=chunk)
        try:
            ids = eng.encode_prompt(messages(img))
            assert eng.decoder.chunk == chunk
            eng.decoder.reset()
            got = eng.prefill_for(ids)(list(ids))
            if x is None:
                x = torch.tensor([list(ids)])
                with torch.no_grad():
                    bidi = model(input_ids=x, pixel_values=hf_pixels(img),
                                 token_type_ids=(x == IMAGE).long()).logits[0, -1]
                    causal = model(input_ids=x, pixel_values=hf_pixels(img)).logits[0, -1]
                assert (bidi - causal).abs().max().item() > 1e-3
            assert (got - bidi).abs().max().item() < 1e-4, chunk
            assert any(k[0] == "wide" for k in eng.decoder._programs) == (chunk < MM_TOKENS)
        finally:
            eng.close()


def test_modeled_ttft_estimate_matches_the_engine(vlm):
    """The device tower's rows within 3% (relative norm) of transformers' fp32 ones. xdna
    estimate's modeled TTFT for an image prompt (tower + prefill, config only) is what
    the simulator charges the engine's own prefill of such a prompt (bf16, within 15%: the
    estimate leaves out the switch between the two programs); a
    bigger tower resolution costs more."""
    from torch_xdna.engine.llm.generate import GenerationConfig
    from torch_xdna.engine.llm.vlm import load_vlm
    from torch_xdna.engine.vision.vlm_estimate import EXTRA_PER_IMAGE, estimate_vlm
    path, _ = vlm
    eng = load_vlm(path, "bf16", max_context=128, prefix_cache=0)
    try:
        ids = eng.encode_prompt(messages(sample_image()))
        eng.complete(ids, GenerationConfig(max_tokens=1))      # compiles the tower
        stats = eng.complete(ids, GenerationConfig(max_tokens=1)).stats
        # the device tower (bf16 operands, strict: no host op) against transformers' fp32
        from torch_xdna.engine.llm.vlm import TowerModule
        with torch.no_grad():
            ref = TowerModule.load(path)(torch.from_numpy(ids.images[0])[None])[0]
        got = eng.tower.rows(ids.images)
        assert ((got - ref).norm() / ref.norm()).item() < 0.03
    finally:
        eng.close()
    text = len(ids) - MM_TOKENS - EXTRA_PER_IMAGE
    r = estimate_vlm(path, [32, 128], ("bf16",), text_tokens=text)
    small, big = r["results"]
    assert small["prompt_tokens"] == len(ids)
    assert small["modeled_ttft_ms"] == pytest.approx(stats.modeled_prefill_us / 1e3, rel=0.15)
    assert big["modeled_tower_ms_per_image"] > small["modeled_tower_ms_per_image"]


def test_txn_level_runs_image_blocks_functionally(vlm, monkeypatch):
    """TORCH_XDNA_SIM_LEVEL=txn: the layers of a chunk with an image block have no array lowering
    (their attention is causal only), so they run functionally, counted with the reason; the
    logits are the functional level's."""
    from torch_xdna.engine.llm.vlm import load_vlm
    from torch_xdna.runtime import get_device
    path, _ = vlm
    eng = load_vlm(path, "bf16", max_context=128, prefix_cache=0)
    try:
        ids = eng.encode_prompt(messages(sample_image()))
        rows = eng.tower.rows(ids.images)
        prefill = eng.prefill_for(ids)
        eng.tower.rows = lambda _images: rows          # the tower is compiled code, not at issue
        eng.decoder.reset()
        ref = prefill(list(ids))
        monkeypatch.setenv("TORCH_XDNA_SIM_LEVEL", "txn")
        txn = get_device().txn
        before = txn.fallbacks
        eng.decoder.reset()
        got = prefill(list(ids))
        assert txn.fallbacks > before
        assert any("bidirectional spans" in why for why in txn.fallback_reasons.values())
        assert torch.allclose(got, ref, atol=1e-3, rtol=1e-3)
    finally:
        eng.close()


def test_cli_generate_with_an_image(vlm, tmp_path, capsys):
    """xdna generate DIR PROMPT --image FILE (fp32): transformers' greedy tokens; a text-only
    directory refuses --image by name."""
    import json
    from torch_xdna.cli.main import main
    from torch_xdna.engine.llm.vlm import load_vlm
    path, model = vlm
    img = sample_image()
    png = tmp_path / "x.png"
    img.save(png)
    eng = load_vlm(path, "fp32", max_context=128, prefix_cache=0)
    try:
        ids = eng.encode_prompt([{"role": "user", "content": [
            {"type": "image", "image": img}, {"type": "text", "text": "what is this?"}]}])
    finally:
        eng.close()
    assert main(["generate", str(path), "what is this?", "--image", str(png), "--precision",
                 "fp32", "--max-tokens", "8", "--max-context", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = hf_greedy_image(model, list(ids), hf_pixels(img), 8)
    assert out["token_ids"] == ref[:len(out["token_ids"])]
    assert out["usage"]["prompt_tokens"] == len(ids)
    text_dir = tmp_path / "text"
    text_dir.mkdir()
    cfg = json.loads((path / "config.json").read_text())
    (text_dir / "config.json").write_text(json.dumps(cfg["text_config"]))
    assert main(["generate", str(text_dir), "hi", "--image", str(png)]) != 0
    assert "takes text only" in capsys.readouterr().err
