"""A fake AIE toolchain on PATH (aiecc.py, Peano's clang++, xclbinutil): each records its argv
and writes the outputs the real one would, so `xdna kernels build` is tested up to the toolchain
call. The fake xclbin has a real axlf header (magic, UUID at the offset XRT reads) followed by a
JSON trailer that tests/fake_pyxrt.py reads for the kernel list."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

AIECC = r'''#!{python}
import json, os, sys, uuid
from pathlib import Path
log = Path(os.environ["FAKE_TOOLCHAIN_LOG"])
with log.open("a") as f:
    f.write(json.dumps(["aiecc.py"] + sys.argv[1:]) + "\n")
if "--version" in sys.argv:
    print("aiecc.py fake 1.2.3"); sys.exit(0)
if os.environ.get("FAKE_AIECC_FAIL"):
    print("error: 'aie.objectfifo' op failed to allocate", file=sys.stderr); sys.exit(1)
mlir = Path(sys.argv[-1]).read_text()
assert "aie.device" in mlir, "not an aie module"
cwd = Path.cwd().name                      # .build-<artifact key>-<random>
key = cwd[len(".build-"):].rsplit("-", 1)[0]
opt = lambda flag, default=None: next((a.split("=", 1)[1] for a in sys.argv
                                       if a.startswith(flag + "=")), default)
kname = opt("--xclbin-kernel-name", "MLIR_AIE")
kernels, mlirs = [], []
if opt("--xclbin-input"):                 # add this kernel to a previous xclbin (add_one_two)
    prev = json.loads(Path(opt("--xclbin-input")).read_bytes().split(b"FAKEJSON", 1)[1])
    kernels, mlirs = prev["kernels"], [k["mlir"] for k in prev["kernels"]]
    assert kname not in [k["name"] for k in kernels], "kernel " + kname + " is already in the xclbin"
u = uuid.uuid5(uuid.NAMESPACE_URL, key + "".join(mlirs) + mlir)
hdr = bytearray(b"xclbin2\0") + bytearray(452 - 8)
hdr[416:432] = u.bytes
kernels.append({{"name": kname, "num_args": 3 + 8, "compute": key, "id": opt("--xclbin-kernel-id"),
                 "mlir": mlir}})          # the emulated NPU configures its array from the module
spec = {{"uuid": str(u), "kernels": kernels, "mlir": kernels[0]["mlir"]}}
name = opt("--xclbin-name")
Path(name).write_bytes(bytes(hdr) + b"FAKEJSON" + json.dumps(spec).encode())
# the instruction stream: an aiecc that agrees with ours (the same name without ".aiecc",
# written before the call), or differs in one word (FAKE_AIECC_FLIP_WORD)
insts = opt("--npu-insts-name")
ours = Path(insts.replace(".aiecc", ""))
if ours.is_file():
    data = bytearray(ours.read_bytes())
    flip = os.environ.get("FAKE_AIECC_FLIP_WORD")
    if flip:
        data[4 * int(flip)] ^= 0x01
    Path(insts).write_bytes(bytes(data))
'''

CLANG = r'''#!{python}
import json, os, sys
from pathlib import Path
with Path(os.environ["FAKE_TOOLCHAIN_LOG"]).open("a") as f:
    f.write(json.dumps(["clang++"] + sys.argv[1:]) + "\n")
if "--version" in sys.argv:
    print("clang version 19.0.0 (llvm-aie fake)"); sys.exit(0)
src = sys.argv[sys.argv.index("-c") + 1]
assert Path(src).is_file(), src
Path(sys.argv[sys.argv.index("-o") + 1]).write_bytes(b"\x7fELF fake object for " + src.encode())
'''

XCLBINUTIL = r'''#!{python}
import json, os, sys
from pathlib import Path
with Path(os.environ["FAKE_TOOLCHAIN_LOG"]).open("a") as f:
    f.write(json.dumps(["xclbinutil"] + sys.argv[1:]) + "\n")
print("XRT Build Version: 2.20.0 (fake)")
'''


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


MLIR_AIE_VERSION = "0.0.1.2026040100+e4f35d6"     # a date-stamped wheel new enough


def fake_mlir_aie(site: Path, version: str | None = MLIR_AIE_VERSION) -> Path:
    """An installed `mlir_aie` wheel's layout under `site` (site-packages): mlir_aie/{bin,
    include/aie_api,lib,python} and its dist-info METADATA with `version` (None: no metadata)."""
    root = site / "mlir_aie"
    for d in ("bin", "include/aie_api", "lib", "python"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "include" / "aie_api" / "aie.hpp").write_text("// fake aie_api\n")
    if version is not None:
        info = site / f"mlir_aie-{version.split('+')[0]}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mlir_aie\nVersion: {version}\n")
    return root


def install(root: Path, monkeypatch, with_peano: bool = True,
            mlir_aie_version: str | None = MLIR_AIE_VERSION) -> Path:
    """Put the fake tools on PATH (aiecc.py inside a fake mlir_aie wheel layout, and
    PEANO_INSTALL_DIR); returns the argv log file."""
    bin_dir, peano = root / "bin", root / "peano"
    aie_root = fake_mlir_aie(root / "site", mlir_aie_version)
    monkeypatch.delenv("MLIR_AIE_INSTALL_DIR", raising=False)
    _script(aie_root / "bin" / "aiecc.py", AIECC)
    _script(bin_dir / "xclbinutil", XCLBINUTIL)
    if with_peano:
        _script(peano / "bin" / "clang++", CLANG)
        monkeypatch.setenv("PEANO_INSTALL_DIR", str(peano))
    else:
        monkeypatch.delenv("PEANO_INSTALL_DIR", raising=False)
    log = root / "argv.log"
    log.write_text("")
    monkeypatch.setenv("FAKE_TOOLCHAIN_LOG", str(log))
    monkeypatch.setenv("PATH", f"{aie_root / 'bin'}{os.pathsep}{bin_dir}{os.pathsep}"
                               f"{os.environ.get('PATH', '')}")
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
