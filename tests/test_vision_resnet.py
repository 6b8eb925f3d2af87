"""ResNet (transformers' ResNetModel) as an image embedder: a random-weight directory with the
ConvNextImageProcessor ResNet checkpoints ship; our preprocessing and pooled output in fp32 (the
embedder's module run on the CPU) within 1e-4 relative of transformers' processor + model; the
device path (compiled, strict: zero host nodes) in bf16 numerics, its error stated beside
transformers' own bf16 run; `xdna embed --image` and /v1/embeddings serve it."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from torch_xdna.engine.vision.image_embedder import ImageEmbedder  # noqa: E402


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for h, w in [(80, 60), (64, 64), (50, 90)]]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    from transformers import ConvNextImageProcessor, ResNetConfig, ResNetModel
    cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
                       num_channels=3)
    torch.manual_seed(0)
    model = ResNetModel(cfg).eval()
    with torch.no_grad():                    # batch-norm statistics away from the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    d = tmp_path_factory.mktemp("resnet")
    model.save_pretrained(d)
    proc = ConvNextImageProcessor(size={"shortest_edge": 32}, crop_pct=0.875, resample=3,
                                  image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    proc.save_pretrained(d)
    emb = ImageEmbedder.load(d)
    yield d, model, proc, emb
    emb.close()


def _reference(model, proc, images, dtype=torch.float32):
    px = proc(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model.to(dtype)(pixel_values=px.to(dtype)).pooler_output.flatten(1).float()


def test_resnet_fp32_preprocessing_and_pooling_match_transformers(resnet):
    d, model, proc, emb = resnet
    assert emb.spec.model_type == "resnet" and emb.dim == 16
    images = _images()
    pixels = emb.preprocess(images)
    ref_px = proc(images=images, return_tensors="np")["pixel_values"]
    assert all(p.shape == (3, 32, 32) for p in pixels)
    np.testing.assert_allclose(np.stack(pixels), ref_px, atol=1e-5, rtol=0)
    # the embedder's loading code and pooled output, run in fp32 on the CPU
    from torch_xdna.engine.vision.image_embedder import PooledImageModel, load_hf_image_model
    m, _ = load_hf_image_model(d, "resnet")
    with torch.no_grad():
        ours = PooledImageModel(m, False)(torch.from_numpy(np.stack(pixels)))
    assert _rel(ours, _reference(model, proc, images)) <= 1e-4


def test_resnet_on_device_strict_bf16_beside_transformers_bf16(resnet):
    from torch_xdna.compiler import backend as B
    d, model, proc, emb = resnet
    images = _images()
    ref = _reference(model, proc, images)
    theirs = _rel(_reference(model, proc, images, torch.bfloat16), ref)
    model.to(torch.float32)
    got = emb.embed_images(images)
    ours = _rel(got, ref)
    print(f"ResNet bf16 relative error: ours {ours:.2e}, transformers bf16 {theirs:.2e}")
    assert ours <= max(3 * theirs, 2e-2), (ours, theirs)
    s = B.HISTORY[-1]
    assert s.nodes_host == 0 and s.partitions == 1


def test_resnet_cli_and_server(resnet, tmp_path, capsys):
    import httpx
    from torch_xdna.cli.main import main
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    d, _, _, emb = resnet
    img = _images()[0]
    f = tmp_path / "a.png"
    img.save(f)
    want = emb.embed_images([img])
    assert main(["embed", "--image", str(f), "--model", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert torch.allclose(torch.tensor(out["data"][0]["embedding"]), want[0], rtol=0, atol=1e-6)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    reg = ModelRegistry(max_models=1)
    reg.add_dir(d, name="resnet")
    with BackgroundServer(create_app(ServerConfig(default_model=False), registry=reg)) as srv:
        r = httpx.post(srv.url + "/v1/embeddings", json={"model": "resnet", "input": [url]})
    assert r.status_code == 200, r.text
    vec = torch.tensor(r.json()["data"][0]["embedding"])
    assert torch.allclose(vec, want[0], rtol=0, atol=1e-6)
