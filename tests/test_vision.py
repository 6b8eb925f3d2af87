"""Image embeddings (models/vision.py, engine/vision/image_embedder.py, `xdna embed --image`,
/v1/embeddings with data URLs): our Pillow preprocessing == transformers' image processors
(ViTImageProcessor, BitImageProcessor as DINOv2 uses) to 1e-4; random-weight ViT and DINOv2
directories compiled on the device under strict() (one partition, zero host nodes) within bf16
tolerance of transformers on CPU; pooled output per the checkpoint; the CLI and the server.
(ViT/ResNet/Whisper graphs alone: tests/test_compile_conformance.py.)"""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from torch_xdna.compiler import backend as B  # noqa: E402
from torch_xdna.device import fallback  # noqa: E402
from torch_xdna.engine.vision.image_embedder import ImageEmbedder  # noqa: E402
from torch_xdna.models.vision import ImagePreprocessor, to_rgb  # noqa: E402


def close(out: torch.Tensor, ref: torch.Tensor) -> None:
    tol = 2e-2 * max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(out, ref, atol=tol, rtol=2e-2)


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    rgb = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
           for h, w in [(40, 50), (37, 29), (32, 32), (90, 21)]]
    rgba = Image.fromarray(rng.integers(0, 256, (30, 33, 4), dtype=np.uint8))
    gray = Image.fromarray(rng.integers(0, 256, (26, 40), dtype=np.uint8))
    return rgb + [rgba, gray]


def _save(model, proc, d):
    model.save_pretrained(d)
    proc.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from transformers import (BitImageProcessor, Dinov2Config, Dinov2Model, ViTConfig,
                              ViTImageProcessor, ViTModel)
    torch.manual_seed(0)
    vit_cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, image_size=32, patch_size=8)
    dino_cfg = Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, image_size=28, patch_size=14)
    return {
        "vit": _save(ViTModel(vit_cfg).eval(), ViTImageProcessor(size={"height": 32, "width": 32}),
                     tmp_path_factory.mktemp("vit")),
        "vit_cls": _save(ViTModel(vit_cfg, add_pooling_layer=False).eval(),
                         ViTImageProcessor(size={"height": 32, "width": 32}, resample=3),
                         tmp_path_factory.mktemp("vit-cls")),
        "dinov2": _save(Dinov2Model(dino_cfg).eval(),
                        BitImageProcessor(size={"shortest_edge": 32},
                                          crop_size={"height": 28, "width": 28},
                                          image_mean=[0.485, 0.456, 0.406],
                                          image_std=[0.229, 0.224, 0.225]),
                        tmp_path_factory.mktemp("dinov2")),
    }


@pytest.mark.parametrize("kind", ["vit", "vit_cls", "dinov2", "dinov2_pad"])
def test_preprocessing_matches_transformers(kind, dirs, tmp_path):
    from transformers import AutoImageProcessor, BitImageProcessor
    if kind == "dinov2_pad":                    # crop larger than the resized image: zero pad
        d = tmp_path
        BitImageProcessor(size={"shortest_edge": 20}, crop_size={"height": 28, "width": 24},
                          resample=2).save_pretrained(d)
        mtype = "dinov2"
    else:
        d, mtype = dirs[kind], kind.split("_")[0]
    ours = ImagePreprocessor.from_dir(d, mtype, 28)
    ref = AutoImageProcessor.from_pretrained(d, use_fast=False)
    for img in _images():
        if not getattr(ref, "do_convert_rgb", None):
            img = to_rgb(img)                   # ViT's processor leaves modes alone; ours converts
        want = ref(images=[img], return_tensors="np")["pixel_values"][0]
        got = ours(img)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def _reference(d, mtype, images):
    from transformers import AutoImageProcessor, Dinov2Model, ViTModel
    px = AutoImageProcessor.from_pretrained(d, use_fast=False)(
        images=[to_rgb(i) for i in images], return_tensors="pt")["pixel_values"]
    if mtype == "dinov2":
        m = Dinov2Model.from_pretrained(d)
    else:
        m = ViTModel.from_pretrained(d, add_pooling_layer=mtype == "vit")
    with torch.no_grad():
        out = m.eval()(pixel_values=px)
    return out.pooler_output if mtype != "vit_cls" else out.last_hidden_state[:, 0]


@pytest.fixture(scope="module")
def embedders(dirs, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    embs = {k: ImageEmbedder(d, max_batch=4, cache_dir=cache) for k, d in dirs.items()}
    yield embs
    for e in embs.values():
        e.close()


@pytest.mark.parametrize("kind", ["vit", "vit_cls", "dinov2"])
def test_image_model_on_device_strict_matches_transformers(kind, dirs, embedders):
    emb = embedders[kind]
    assert emb.spec.pooling == ("cls" if kind == "vit_cls" else "pooler")
    images = _images()[:5]
    vecs = emb.embed_images(images)
    s = B.HISTORY[-1]
    assert (s.partitions, s.nodes_host, s.host_ops) == (1, 0, {}), s
    assert fallback.report() == {}
    close(vecs, _reference(dirs[kind], kind, images))
    one = emb.embed_images(images[1:2])           # batch padding never changes a vector
    torch.testing.assert_close(one[0], vecs[1], atol=1e-5, rtol=1e-5)


def test_cli_embed_image(dirs, embedders, tmp_path, capsys):
    from torch_xdna.cli.main import main
    files = []
    for i, img in enumerate(_images()[:2]):
        files.append(str(tmp_path / f"i{i}.png"))
        img.save(files[-1])
    assert main(["embed", "--image", *files, "--model", str(dirs["dinov2"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dimensions"] == 32 and [d["file"] for d in out["data"]] == files
    ref = embedders["dinov2"].embed_images([Image.open(f) for f in files])
    close(torch.tensor([d["embedding"] for d in out["data"]]), ref)
    assert main(["embed", "--image", files[0]]) == 2                      # no --model
    (tmp_path / "bad.png").write_bytes(b"GIF89a nope")
    assert main(["embed", "--image", str(tmp_path / "bad.png"), "--model",
                 str(dirs["dinov2"])]) == 2


def _data_url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_server_embeds_data_urls(dirs, embedders):
    from fastapi.testclient import TestClient
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.registry import ModelRegistry
    from torch_xdna.server.registry import model_kind
    assert model_kind(dirs["vit"]) == model_kind(dirs["dinov2"]) == "image"
    reg = ModelRegistry(max_models=2)
    reg.add_object(embedders["vit"], "image", "tiny-vit")     # compiled already: no recompile
    images = _images()[:3]
    with TestClient(create_app(ServerConfig(default_model=False), registry=reg)) as c:
        assert {m["id"]: m["kind"] for m in c.get("/v1/models").json()["data"]} == \
            {"tiny-vit": "image"}
        r = c.post("/v1/embeddings", json={"model": "tiny-vit",
                                           "input": [_data_url(i) for i in images]})
        assert r.status_code == 200, r.text
        body = r.json()
        got = torch.tensor([d["embedding"] for d in body["data"]])
        torch.testing.assert_close(got, embedders["vit"].embed_images(images), atol=1e-5,
                                   rtol=1e-5)
        assert body["usage"]["prompt_tokens"] == 3 * (16 + 1)                 # patches + CLS
        r = c.post("/v1/embeddings", json={"input": _data_url(images[0]), "dimensions": 8})
        v = torch.tensor(r.json()["data"][0]["embedding"])
        assert v.shape == (8,) and abs(float(v.norm()) - 1) < 1e-5
        for bad, code in [("hello", "invalid_image"), ([1, 2, 3], "invalid_input"),
                          ("data:image/png;base64,AAAA", "invalid_image")]:
            r = c.post("/v1/embeddings", json={"model": "tiny-vit", "input": bad})
            assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text


def test_estimate_image_and_sr_dirs(tmp_path, capsys):
    """`xdna estimate DIR` from config.json alone: modeled NPU ms per image / per megapixel with
    zero host nodes, next to a measured CPU forward."""
    from transformers import ViTConfig
    from torch_xdna.cli.main import main
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
              image_size=32, patch_size=8).save_pretrained(tmp_path / "vit")
    (tmp_path / "sr").mkdir()
    (tmp_path / "sr" / "config.json").write_text(json.dumps(
        {"architecture": "espcn", "scale": 2, "channels": 1, "features": [8, 8]}))
    for d, key in [("vit", "modeled_npu_ms_per_image"), ("sr", "modeled_npu_ms_per_megapixel")]:
        assert main(["estimate", str(tmp_path / d), "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert r["modeled"] and r["host_nodes"] == 0 and r["partitions"] == 1
        assert r[key] > 0 and r["measured_cpu_ms"] > 0


@pytest.fixture(autouse=True)
def _fresh_fallback_counts():
    """fallback.report() is process-wide: start each test from zero (other files run host ops)."""
    fallback.reset()
    yield
