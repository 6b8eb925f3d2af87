"""`xdna design show NAME --shape ...`: what a design is on the array (modeled, not run): its
tiles, object FIFOs and BD counts, the instruction-stream size of one launch, and optionally the
MLIR-AIE source and the stream written to files. `xdna design check NAME --shape ...`: the
design's violations of mlir-aie's rules (array/rules.py), exit 1 if any."""
from __future__ import annotations

import argparse
import json

from torch_xdna.cli.args import add_command

GEMM_NAMES = ("gemm", "gemv")
ROW_NAMES = ("softmax", "rms_norm", "layer_norm")


def register(subparsers) -> None:
    p = add_command(
        subparsers, "design", help="show a design as an NPU program (tiles, FIFOs, BDs, stream)",
        description="Lower a design's plan to the array IR and show it: tiles, object FIFOs, "
                    "buffer descriptors, runtime-sequence tasks and instruction-stream words. "
                    "Nothing runs; the figures are what the IR and the stream encoder produce.",
        epilog="examples:\n  xdna design show gemm --shape 256x512x384\n"
               "  xdna design show gemv --shape 1x1024x3072 --dtype int4 --group 32\n"
               "  xdna design show rms_norm --shape 8x1024 --mlir rms.mlir --stream rms.txn\n"
               "  xdna design show add --shape 4096 --json\n"
               "  xdna design check gemm --shape 512x512x512")
    sub = p.add_subparsers(dest="design_cmd", metavar="show|check")
    s = sub.add_parser("show", help="show one design")
    c = sub.add_parser("check", help="check a design against mlir-aie's rules (array/rules.py)",
                       description="Verify each array program of a design against the upstream "
                                   "(mlir-aie) rules: one line per violation (rule, where, "
                                   "message, citation); exit 1 if any.")
    _design_args(c)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_check)
    _design_args(s)
    s.add_argument("--mlir", metavar="FILE", help="write the MLIR-AIE module(s) here")
    s.add_argument("--stream", metavar="FILE", help="write the launch's instruction stream here")
    s.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _design_args(s) -> None:
    """The arguments naming one design (show and check)."""
    s.add_argument("name", help="gemm | gemv | attention | decode_layer | softmax | rms_norm | "
                                "layer_norm | an elementwise op (add, mul, silu, ...)")
    s.add_argument("--shape", required=True,
                   help="MxKxN for gemm/gemv; BxHqxHkvxLqxSxD for attention; "
                        "HIDDENxINTERMEDIATExHEADSxKV_HEADSxHEAD_DIMxCAPACITY for decode_layer "
                        "(Qwen3-0.6B: 1024x3072x16x8x128x1024); RxC (or N) otherwise")
    s.add_argument("--causal", action="store_true", help="attention: causal mask")
    s.add_argument("--kv-len", type=int, help="attention: valid keys of this launch")
    s.add_argument("--dtype", default="bf16", help="gemm operand dtype: bf16 | int8 | bfp16 | "
                   "int4 (weights); vector input dtype: float32 | bfloat16")
    s.add_argument("--group", type=int, default=0, help="weight group along K (int8/int4 weights)")
    s.add_argument("--generation", default="npu4")


def _shape(text: str) -> tuple[int, ...]:
    from torch_xdna.cli.args import CliError
    try:
        dims = tuple(int(x) for x in text.replace(",", "x").split("x"))
    except ValueError:
        raise CliError(f"--shape {text!r}: give sizes as MxKxN or RxC (integers)") from None
    if not dims or min(dims) <= 0:
        raise CliError(f"--shape {text!r}: sizes must be positive")
    return dims


def build_design(name: str, shape: tuple[int, ...], dtype: str = "bf16", group: int = 0,
                 causal: bool = False):
    """A design from a CLI name and shape (the same designs the compiler and engine create)."""
    import torch

    from torch_xdna.cli.args import CliError
    if name == "attention":
        from torch_xdna.kernels.ops.attention import AttentionDesign
        if len(shape) != 6:
            raise CliError(f"attention needs --shape BxHqxHkvxLqxSxD, got {shape}")
        return AttentionDesign(*shape, causal=causal)
    if name == "decode_layer":
        from torch_xdna.kernels.blocks.llm import AttentionBlockDesign, DecoderLayerDesign, \
            MlpBlockDesign
        from torch_xdna.kernels.blocks.weights import default_group
        if len(shape) != 6:
            raise CliError(f"decode_layer needs --shape HIDDENxINTERxHEADSxKVxHEAD_DIMxCAPACITY, got {shape}")
        h, f, hq, hkv, hd, cap = shape
        g = group or default_group(dtype)
        a = AttentionBlockDesign(h, 1, dtype, g, 1e-6, 0.0, hq, hkv, hd, cap, qk_norm=True)
        return DecoderLayerDesign(a, MlpBlockDesign(h, 1, dtype, g, 1e-6, 0.0, f))
    from torch_xdna.kernels.ops.gemm import GemmDesign
    from torch_xdna.kernels.ops.vector import OPS, VectorDesign
    if name in GEMM_NAMES:
        if len(shape) != 3:
            raise CliError(f"{name} needs --shape MxKxN, got {shape}")
        m, k, n = shape
        return GemmDesign(m, k, n, dtype=dtype, w_group=group or (32 if dtype == "int4" else 0))
    if name not in OPS:
        raise CliError(f"unknown design {name!r}; use gemm, gemv, {', '.join(ROW_NAMES)} or an "
                       f"elementwise op ({', '.join(sorted(OPS)[:8])}, ...)")
    tdt = getattr(torch, {"bf16": "bfloat16"}.get(dtype, dtype), None)
    if not isinstance(tdt, torch.dtype):
        raise CliError(f"--dtype {dtype!r} is not a torch dtype (float32, bfloat16)")
    f32 = torch.float32
    if name == "rms_norm":
        return VectorDesign(name, (shape, shape[-1:]), (tdt, f32), shape, f32,
                            (("eps", 1e-6), ("has_weight", True)))
    if name == "layer_norm":
        return VectorDesign(name, (shape, shape[-1:], shape[-1:]), (tdt, f32, f32), shape, f32,
                            (("eps", 1e-5), ("has_bias", True), ("has_weight", True), ("norm_dims", 1)))
    if name in ("softmax", "log_softmax"):
        return VectorDesign(name, (shape,), (tdt,), shape, f32, (("dim", -1),))
    import inspect
    fn, _ = OPS[name]
    try:
        n_in = 2 if "xs[1]" in inspect.getsource(fn) else 1
    except (OSError, TypeError):
        n_in = 1
    return VectorDesign(name, (shape,) * n_in, (tdt,) * n_in, shape, f32)


def describe(design, gen, **launch) -> dict:
    """Tiles, FIFOs, BDs and stream size of each program of one launch."""
    from torch_xdna.array.validate import validate
    from torch_xdna.kernels.lower import lower
    plan = design.plan(gen)
    out = {"design": design.name, "generation": gen.name, "plan": plan.summary(), "programs": []}
    for prog in lower(design, gen, **launch):
        u = validate(prog, gen)
        kinds = {}
        for t in prog.tiles:
            kinds[t.kind] = kinds.get(t.kind, 0) + 1
        entry = {
            "name": prog.name, "stage": dict(prog.notes).get("stage"), "tiles": kinds, "columns": sorted({t.col for t in prog.tiles}),
            "fifos": [{"name": f.name, "from": f.producer.name, "to": [c.name for c in f.consumers],
                       "depth": f.depth, "elem": f"{'x'.join(map(str, f.elem.shape))}x{f.elem.dtype}"}
                      for f in prog.fifos],
            "links": len(prog.links), "kernels": [k.symbol for k in prog.kernels],
            "l1_bytes_max": u.max_of("memory", "compute", prog),
            "memtile_bytes_max": u.max_of("memory", "mem", prog),
            "core_bds_max": u.max_of("bds", "compute", prog),
            "memtile_bds_max": u.max_of("bds", "mem", prog),
            "shim_bds_in_flight_max": max(u.shim_bds_in_flight.values(), default=0),
            "tasks": u.tasks, "awaits": u.awaits, "bytes_in": u.bytes_in, "bytes_out": u.bytes_out,
        }
        try:
            from torch_xdna.array import txn
        except ImportError:
            txn = None
        if txn is not None:
            words = txn.encode_sequence(prog)
            st = txn.stream_stats(words)
            entry["stream"] = {"words": st.words, "bytes": st.bytes, "bd_writes": st.bd_writes,
                               "patches": st.patches, "pushes": st.pushes, "syncs": st.syncs}
            entry["_words"] = words
        out["programs"].append((prog, entry))
    return out


def run(args: argparse.Namespace) -> int:
    from torch_xdna.cli.args import CliError
    from torch_xdna.hw import get_generation
    if getattr(args, "design_cmd", None) != "show":
        raise CliError("use: xdna design show|check NAME --shape ...")
    gen = get_generation(args.generation)
    d = build_design(args.name, _shape(args.shape), args.dtype, args.group, args.causal)
    info = describe(d, gen, **({"kv_len": args.kv_len} if args.kv_len else {}))
    progs = info.pop("programs")
    if args.mlir:
        from torch_xdna.array.mlir import to_mlir
        with open(args.mlir, "w") as f:
            f.write("\n".join(to_mlir(p, gen.arch) for p, _ in progs))
    if args.stream:
        from torch_xdna.array import txn
        with open(args.stream, "wb") as f:
            for _, e in progs:
                f.write(txn.to_bytes(e["_words"]))
    entries = []
    for _, e in progs:
        e.pop("_words", None)
        entries.append(e)
    info["programs"] = entries
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['design']} on {gen.name} (plan: {info['plan']})")
    if len(entries) > 1:
        words = sum(e.get("stream", {}).get("words", 0) for e in entries)
        print(f"{len(entries)} programs per launch, {sum(e['tasks'] for e in entries)} shim tasks, "
              f"{words} stream words in all")
    for e in entries:
        stage = f" [{e['stage']}]" if e.get("stage") else ""
        print(f"program {e['name']}{stage}: tiles {e['tiles']} in columns {e['columns']}, "
              f"{len(e['fifos'])} fifos, {e['links']} mem-tile links, kernels {', '.join(e['kernels'])}")
        print(f"  L1 {e['l1_bytes_max']} B/core, mem tile {e['memtile_bytes_max']} B, BDs core "
              f"{e['core_bds_max']} / mem tile {e['memtile_bds_max']} / shim in flight "
              f"{e['shim_bds_in_flight_max']}")
        print(f"  runtime sequence: {e['tasks']} shim tasks, {e['awaits']} awaits, "
              f"{e['bytes_in']} B in, {e['bytes_out']} B out")
        if "stream" in e:
            s = e["stream"]
            print(f"  instruction stream: {s['words']} words ({s['bytes']} B): {s['bd_writes']} BD "
                  f"writes, {s['patches']} address patches, {s['pushes']} queue pushes, "
                  f"{s['syncs']} syncs")
        for f in e["fifos"][:12]:
            print(f"    fifo {f['name']}: {f['from']} -> {', '.join(f['to'])} depth {f['depth']} "
                  f"of {f['elem']}")
        if len(e["fifos"]) > 12:
            print(f"    ... {len(e['fifos']) - 12} more fifos (--json lists all)")
    if args.mlir:
        print(f"wrote MLIR to {args.mlir}")
    if args.stream:
        print(f"wrote instruction stream to {args.stream}")
    return 0


def check(design, gen, **launch) -> dict:
    """Upstream-rule violations of each program of one launch (array/rules.py, with the C++
    kernel contract), and the programs mlir-aie has no form for (array/mlir.form_errors)."""
    from torch_xdna.array import rules
    from torch_xdna.array.mlir import form_errors
    from torch_xdna.kernels.lower import lower
    from torch_xdna.kernels.toolchain.build import kernel_contract_errors
    out = {"design": design.name, "generation": gen.name, "programs": []}
    for prog in lower(design, gen, **launch):
        vs = rules.verify(prog, gen, contract=kernel_contract_errors)
        out["programs"].append({
            "name": prog.name, "no_upstream_form": form_errors(prog),
            "violations": [{"rule": v.rule, "where": v.where, "message": v.message,
                            "citation": v.citation} for v in vs]})
    return out


def run_check(args: argparse.Namespace) -> int:
    from torch_xdna.hw import get_generation
    gen = get_generation(args.generation)
    d = build_design(args.name, _shape(args.shape), args.dtype, args.group, args.causal)
    info = check(d, gen, **({"kv_len": args.kv_len} if args.kv_len else {}))
    bad = sum(len(p["violations"]) for p in info["programs"])
    if args.json:
        print(json.dumps(info, indent=2))
        return 1 if bad else 0
    for p in info["programs"]:
        for v in p["violations"]:
            print(f"{v['rule']}\t{p['name']}: {v['where']}\t{v['message']}\t[{v['citation']}]")
        for e in p["no_upstream_form"][:3]:
            print(f"no upstream form\t{e}")
    from torch_xdna.array.rules import RULES
    print(f"{info['design']} on {gen.name}: {len(info['programs'])} program(s), {bad} violation(s) "
          f"of {len(RULES)} upstream rules")
    return 1 if bad else 0
