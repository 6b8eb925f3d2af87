"""`xdna design show`: tiles, FIFOs, BDs and stream size; MLIR and stream written to files."""
import json
import subprocess
import sys

from torch_xdna.cli.main import main


def test_design_show_writes_mlir_and_stream(tmp_path, capsys):
    mlir, stream = tmp_path / "g.mlir", tmp_path / "g.txn"
    assert main(["design", "show", "gemm", "--shape", "64x64x64", "--mlir", str(mlir),
                 "--stream", str(stream)]) == 0
    out = capsys.readouterr().out
    assert "instruction stream:" in out and "fifo A0" in out
    assert mlir.read_text().startswith("module {") and "aie.device(npu2)" in mlir.read_text()
    assert stream.stat().st_size > 0 and stream.stat().st_size % 4 == 0


def test_design_show_json(capsys):
    assert main(["design", "show", "rms_norm", "--shape", "8x1024", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    prog = info["programs"][0]
    assert prog["tiles"]["compute"] >= 1 and prog["stream"]["words"] > 0
    assert prog["l1_bytes_max"] > 0


def test_design_show_bad_name(capsys):
    assert main(["design", "show", "nosuch", "--shape", "8"]) != 0
    assert "unknown design" in capsys.readouterr().err


def test_design_show_decode_layer_and_attention(capsys):
    assert main(["design", "show", "decode_layer", "--shape", "256x512x4x2x64x256",
                 "--dtype", "int4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    stages = [p["stage"] for p in info["programs"]]
    assert stages[0] == "llm_layer.attn_norm" and stages[-1] == "llm_layer.mlp_residual"
    assert "llm_layer.qk_rope" in stages and len(stages) == 12      # executable stages
    assert main(["design", "show", "attention", "--shape", "1x4x2x1x256x64", "--causal",
                 "--kv-len", "100"]) == 0
    assert "attn_tile_bf16" in capsys.readouterr().out


def test_design_check_passes_and_fails(capsys):
    """`xdna design check`: exit 0 and no violation lines for a design within mlir-aie's rules;
    exit 1 with one line per violation (rule, where, message, citation) otherwise."""
    assert main(["design", "check", "gemm", "--shape", "256x256x256"]) == 0
    out = capsys.readouterr().out
    assert "0 violation(s)" in out
    assert main(["design", "check", "gemm", "--shape", "512x512x512"]) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("bds_per_tile\t")]
    assert lines and "buffer descriptors exceeded" in lines[0] and "Xilinx/mlir-aie" in lines[0]


def test_design_check_json(capsys):
    assert main(["design", "check", "softmax", "--shape", "8x1024", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["programs"] and all(p["violations"] == [] for p in info["programs"])
