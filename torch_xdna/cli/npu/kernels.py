"""`xdna kernels`: build hardware artifacts (xclbin + instruction stream + manifest) for designs
with the AIE toolchain, or write what the toolchain would be given (--dry-run) anywhere."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from torch_xdna.cli.args import add_command

EPILOG = """\
examples:
  xdna kernels list                                   designs by name and the core-kernel sources
  xdna kernels build --check                          is the AIE toolchain installed?
  xdna kernels build --design gemm --shape 256x512x256
  xdna kernels build --design add_one --shape 1024 --design gemm --shape 64x64x64
  xdna kernels build --model ~/models/Qwen3-0.6B      every design that model launches
  xdna kernels build --all-for qwen3-0.6b             the same for a built-in model shape
  xdna kernels build --all-for all-MiniLM-L6-v2 --dry-run   the default embedding model's
  xdna kernels build --design relu --shape 4096 --dry-run --out build/relu
                                                      MLIR, kernel sources, stream: no toolchain

Artifacts go to $TORCH_XDNA_ARTIFACT_DIR (default ~/.local/share/torch-xdna/artifacts), where the
xrt backend finds them; then run `xdna selftest`. Nothing here has been run against a physical
NPU or the real toolchain by this project: see docs/hardware.md."""


def register(subparsers) -> None:
    p = add_command(subparsers, "kernels", help="build NPU artifacts for designs with the AIE toolchain",
                    description=__doc__, epilog=EPILOG)
    sub = p.add_subparsers(dest="kernels_command", metavar="ACTION")
    b = add_command(sub, "build", help="build and install artifacts", epilog=EPILOG)
    b.add_argument("--design", action="append", default=[], metavar="NAME",
                   help="a design from `xdna kernels list` (repeatable, each with its --shape)")
    b.add_argument("--shape", action="append", default=[], metavar="S",
                   help="its shape, e.g. 256x512x256 for a GEMM's MxKxN")
    b.add_argument("--dtype", default=None, help="operand dtype (default: the design's)")
    b.add_argument("--model", metavar="DIR", help="every design a Hugging Face decoder, embedding "
                   "or Whisper model directory launches")
    b.add_argument("--all-for", metavar="PROFILE", help="the same for a built-in shape (e.g. qwen3-0.6b, "
                   "all-MiniLM-L6-v2: the bundled default embedding model)")
    b.add_argument("--precision", default="bf16", help="weights for --model/--all-for (bf16|int8|int4)")
    b.add_argument("--max-context", type=int, default=4096, metavar="TOKENS",
                   help="KV capacity the engine will run with for --model/--all-for (as `xdna "
                        "generate --max-context`; capped by the model's maximum; default 4096)")
    b.add_argument("--prefill-chunk", type=int, default=128, metavar="TOKENS",
                   help="prompt tokens per prefill launch the engine will use (as `xdna generate "
                        "--prefill-chunk`; default 128; Whisper's decoder at most 64): one design "
                        "per rows bucket 1, 2, 4, ... up to it")
    b.add_argument("--max-batch", type=int, default=32, metavar="N",
                   help="sequences per launch an embedding model's engine will use (as the "
                        "Embedder's max_batch; default 32): one design set per batch bucket 1, 2, "
                        "4, ... up to it and per sequence bucket")
    b.add_argument("--generation", default=None, help="NPU generation (default: TORCH_XDNA_GENERATION or npu4)")
    b.add_argument("--artifact-dir", type=Path, default=None, help="where to install (default: the store)")
    b.add_argument("--keep-build", type=Path, default=None, metavar="DIR",
                   help="also copy the build directory here (kept on failure too)")
    b.add_argument("--dry-run", action="store_true",
                   help="write the MLIR, kernel sources and instruction stream to --out; no toolchain")
    b.add_argument("--out", type=Path, default=Path("xdna-build"), help="--dry-run output directory")
    b.add_argument("--check", action="store_true", help="only check that the toolchain is installed")
    b.add_argument("--json", action="store_true", help="machine-readable result")
    b.set_defaults(func=run_build)
    ls = sub.add_parser("list", help="designs by name and core-kernel sources")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run_list)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def _generation(name: str | None):
    from torch_xdna.hw import get_generation
    from torch_xdna.runtime import settings
    return get_generation(name or settings.get("TORCH_XDNA_GENERATION"))


def run_list(args) -> int:
    from torch_xdna.kernels import aie
    from torch_xdna.kernels.toolchain import catalog
    data = {"designs": {k: v[2] for k, v in catalog.DESIGNS.items()},
            "kernel_sources": list(aie.SOURCES), "kernel_symbols": sorted(aie.KERNELS)}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("designs (xdna kernels build --design NAME --shape S):")
    for name, text in data["designs"].items():
        print(f"  {name:<10} {text}")
    print(f"core kernels: {len(data['kernel_symbols'])} symbols in {', '.join(data['kernel_sources'])} "
          f"(torch_xdna/kernels/aie/aie2p/)")
    return 0


def _examples(args, gen) -> tuple[list, list[str]]:
    """(examples to build, designs skipped with the reason)."""
    from torch_xdna.cli.args import CliError
    from torch_xdna.kernels.toolchain import catalog
    if len(args.design) != len(args.shape):
        raise CliError(f"give one --shape per --design ({len(args.design)} designs, "
                       f"{len(args.shape)} shapes)")
    exs = [catalog.example(d, s, args.dtype) for d, s in zip(args.design, args.shape)]
    skipped: list[str] = []
    from torch_xdna.engine.asr.designs import is_whisper
    if args.model and is_whisper(args.model):
        from torch_xdna.engine.asr.designs import model_designs as whisper_designs
        from torch_xdna.engine.asr.whisper import DEFAULT_CHUNK
        found = whisper_designs(args.model, args.precision, min(args.prefill_chunk, DEFAULT_CHUNK))
        exs += found[0]
        skipped += found[1]
    elif args.model or args.all_for:
        from torch_xdna.engine.embed.designs import model_designs as encoder_designs
        found_why = encoder_designs(args.model or args.all_for, max_batch=args.max_batch)
        if found_why is None:              # not an encoder: a decoder's designs
            from torch_xdna.engine.llm.designs import model_designs
            found_why = model_designs(args.model or args.all_for, args.precision, gen,
                                      context=args.max_context, chunk=args.prefill_chunk)
        exs += found_why[0]
        skipped += found_why[1]
    if not exs and not skipped:
        raise CliError("nothing to build: give --design NAME --shape S, --model DIR or --all-for "
                       "PROFILE (see `xdna kernels list`)")
    return exs, skipped


def run_build(args) -> int:
    from torch_xdna.kernels.toolchain.build import BuildError, ToolchainMissing, find_toolchain
    from torch_xdna.kernels.toolchain.staged import build_design
    gen = _generation(args.generation)
    if args.check:
        try:
            tc = find_toolchain()
        except ToolchainMissing as e:
            print(str(e), file=sys.stderr)
            return 2
        print(json.dumps(tc.versions, indent=2) if args.json else
              "toolchain: " + ", ".join(f"{k} {v}" for k, v in tc.versions.items()))
        return 0
    exs, skipped = _examples(args, gen)
    if args.dry_run:
        return _dry_run(exs, skipped, gen, args)
    try:
        tc = find_toolchain()
    except ToolchainMissing as e:
        print(str(e), file=sys.stderr)      # exit 2, the store untouched
        return 2
    from torch_xdna.kernels.toolchain.artifacts import default_artifact_dir
    root = args.artifact_dir or default_artifact_dir()
    results, failed = [], []
    for i, ex in enumerate(exs, 1):
        label = f"[{i}/{len(exs)}] {ex.design.name} ({ex.design.artifact_key()})"
        print(label, file=sys.stderr)
        try:
            r = build_design(ex, gen, tc, root, keep_build=args.keep_build,
                               log=lambda s: print(s, file=sys.stderr))
        except (BuildError, ValueError) as e:      # ValueError: a lowering refused the shape
            failed.append({"design": ex.design.name, "key": ex.design.artifact_key(), "error": str(e)})
            print(f"  failed: {e}", file=sys.stderr)
            continue
        results.append({"design": ex.design.name, "key": r.key, "dir": str(r.directory),
                        "xclbin_uuid": r.uuid, "stream_matches_aiecc": r.stream_matches_aiecc})
    out = {"generation": gen.name, "artifact_dir": str(root), "built": results, "failed": failed,
           "skipped": skipped, "toolchain": tc.versions}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"built {len(results)}, failed {len(failed)}, skipped {len(skipped)} -> {root}")
        for s in skipped:
            print(f"  skipped: {s}")
    return 0 if not failed else 1


def _dry_run(exs, skipped, gen, args) -> int:
    """Everything the toolchain would be given, without running it."""
    from torch_xdna.array import mlir as aie_mlir
    from torch_xdna.array import txn
    from torch_xdna.kernels.toolchain.build import BuildError, kernel_objects
    from torch_xdna.kernels.toolchain import launch_abi
    from torch_xdna.runtime.xrt.artifacts import ArtifactError
    written = []
    for ex in exs:
        d = args.out / ex.design.artifact_key()
        try:
            progs = launch_abi.lower_example(ex, gen)
            d.mkdir(parents=True, exist_ok=True)
            if launch_abi.is_staged(progs):
                _dry_run_staged(ex, progs, gen, d)
                written.append(str(d))
                continue
            for j, prog in enumerate(progs):
                stem = "design" if len(progs) == 1 else f"design.{j}"
                (d / f"{stem}.mlir").write_text(aie_mlir.to_mlir(prog, gen.arch))
                nbytes = [a.type.nbytes for a in prog.sequence.args]
                scalars = {s.name: 0 for s in prog.sequence.scalars}
                words = txn.encode_sequence(prog, txn.LaunchBinding.of(nbytes, **scalars))
                (d / f"{stem}.insts.bin").write_bytes(txn.to_bytes(words))
                for obj, (src, defines) in kernel_objects(prog, gen.arch).items():
                    shutil.copy2(src, d / src.name)
                    (d / f"{obj}.defines").write_text(" ".join(defines) + "\n")
        except (BuildError, ValueError, ArtifactError) as e:
            skipped.append(f"{ex.design.name}: {e}")
            continue
        written.append(str(d))
    out = {"written": written, "skipped": skipped}
    print(json.dumps(out, indent=2) if args.json else
          "\n".join([f"wrote {w}" for w in written] + [f"skipped: {s}" for s in skipped]))
    return 0


def _dry_run_staged(ex, progs, gen, d: Path) -> None:
    """A staged design: each stage's MLIR, the fixed streams, kernel sources and the launch ABI
    (launch.json, checked by the xrt backend's own validator)."""
    from torch_xdna.array import mlir as aie_mlir
    from torch_xdna.array import txn
    from torch_xdna.kernels.toolchain import launch_abi
    from torch_xdna.kernels.toolchain.build import kernel_objects
    from torch_xdna.runtime.xrt.artifacts import check_launch
    launch = launch_abi.launch_abi(progs, ex.inputs, ex.outputs)
    files = {}
    for j, (prog, st) in enumerate(zip(progs, launch["stages"])):
        (d / f"design.{j}.mlir").write_text(aie_mlir.to_mlir(prog, gen.arch))
        if st["stream"] == "fixed":
            nbytes = [a.type.nbytes for a in prog.sequence.args]
            scalars = {s.name: 0 for s in prog.sequence.scalars}
            words = txn.encode_sequence(prog, txn.LaunchBinding.of(nbytes, **scalars))
            (d / f"{st['insts']}.bin").write_bytes(txn.to_bytes(words))
            files[st["insts"]] = {"path": f"{st['insts']}.bin"}
        for obj, (src, defines) in kernel_objects(prog, gen.arch, gen_dir=d).items():
            if src.parent != d:
                shutil.copy2(src, d / src.name)
            (d / f"{obj}.defines").write_text(" ".join(defines) + "\n")
    check_launch(ex.design.artifact_key(), str(d / "launch.json"), launch, files)
    (d / "launch.json").write_text(json.dumps(launch, indent=2) + "\n")
