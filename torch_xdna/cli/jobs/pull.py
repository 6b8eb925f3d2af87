"""`xdna pull REPO`: download a model from the Hugging Face Hub into a local directory that
`xdna serve --model` and `xdna generate` take, for users who have a network. The only command
that downloads anything (serving never does). huggingface_hub lists the files and builds their
URLs and auth headers; the transfer is ours, so that an interrupted pull resumes where it stopped
when run again (huggingface_hub 2.x restarts a file a new process downloads): a progress bar per
file, bytes in FILE.part until it is complete."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torch_xdna.cli.args import CliError, add_command
from torch_xdna.runtime import settings

# what serving needs from a model repository (weights, configs, tokenizers, templates)
PATTERNS = ["*.json", "*.safetensors", "*.gguf", "*.txt", "*.model", "*.jinja", "*.tiktoken",
            "1_Pooling/*", "2_Normalize/*"]


def models_dir() -> Path:
    base = settings.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "torch-xdna" / "models"


def register(subparsers) -> None:
    p = add_command(subparsers, "pull", help="download a model from the Hugging Face Hub",
                    description="Download a model repository (weights, config, tokenizer) into "
                                "a local directory for `xdna serve --model DIR`. Resumable: run "
                                "it again after an interruption.",
                    epilog="examples:\n  xdna pull Qwen/Qwen3-0.6B\n"
                           "  xdna pull sentence-transformers/all-MiniLM-L6-v2 --dir ./minilm\n"
                           "  xdna pull unsloth/Qwen3-0.6B-GGUF --include '*Q4_0.gguf'")
    p.add_argument("repo", metavar="REPO", help="Hugging Face repository id (OWNER/NAME)")
    p.add_argument("--dir", metavar="DIR", help="where to put it (default: "
                   "$XDG_DATA_HOME/torch-xdna/models/NAME)")
    p.add_argument("--revision", metavar="REV", help="branch, tag or commit (default: main)")
    p.add_argument("--include", action="append", metavar="GLOB",
                   help="only files matching GLOB (repeatable; default: weights, configs, "
                        "tokenizer files)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.repo.count("/") != 1 or not all(args.repo.split("/")):
        raise CliError(f"{args.repo!r} is not a repository id; write OWNER/NAME "
                       f"(e.g. Qwen/Qwen3-0.6B)")
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
    except ImportError as e:
        raise CliError("xdna pull needs huggingface_hub; install it: pip install "
                       "huggingface_hub") from e
    import httpx
    dest = Path(args.dir) if args.dir else models_dir() / args.repo.split("/")[1]
    endpoint = settings.get("HF_ENDPOINT")
    print(f"pulling {args.repo} into {dest}", file=sys.stderr)
    try:
        files = _files(HfApi(endpoint=endpoint), args.repo, args.revision,
                       args.include or PATTERNS)
        for name, size in files:
            _download(_url(args.repo, name, args.revision, endpoint), dest / name, size)
    except RepositoryNotFoundError:
        raise CliError(f"{args.repo}: no such repository on the Hub (or it is private: log in "
                       f"with `hf auth login`)") from None
    except (HfHubHTTPError, httpx.HTTPError, OSError) as e:
        raise CliError(f"{args.repo}: download failed ({' '.join(str(e).split())}); run the "
                       f"same command again to resume") from None
    print(f"done: xdna serve --model {dest}", file=sys.stderr)
    print(dest)
    return 0


def _files(api, repo: str, revision: str | None, patterns: list[str]) -> list[tuple[str, int]]:
    """(path, size) of the repository's files matching `patterns`."""
    from fnmatch import fnmatch
    from huggingface_hub.hf_api import RepoFile
    out = [(f.path, f.size) for f in api.list_repo_tree(repo, revision=revision, recursive=True)
           if isinstance(f, RepoFile) and any(fnmatch(f.path, p) for p in patterns)]
    if not out:
        raise CliError(f"{repo}: no files match {', '.join(patterns)}; pick them with --include")
    return out


def _url(repo: str, name: str, revision: str | None, endpoint: str | None) -> str:
    from huggingface_hub import hf_hub_url
    return hf_hub_url(repo, name, revision=revision, endpoint=endpoint)


def _download(url: str, path: Path, size: int) -> None:
    """One file, resumable: bytes go to PATH.part and a later run asks only for the rest (an
    HTTP Range request); a progress bar on stderr."""
    import httpx
    from huggingface_hub.utils import build_hf_headers
    from tqdm import tqdm
    if path.is_file() and path.stat().st_size == size:
        return                                           # pulled already
    part = path.with_name(path.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    headers = build_hf_headers()
    if 0 < have < size:
        headers["Range"] = f"bytes={have}-"
    elif have >= size:
        have = 0
    with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as r:
        r.raise_for_status()
        if r.status_code != 206:                         # the server sent the whole file
            have = 0
        with open(part, "ab" if have else "wb") as f, \
                tqdm(total=size, initial=have, unit="B", unit_scale=True, desc=path.name,
                     file=sys.stderr) as bar:
            for chunk in r.iter_bytes():              # as they arrive: all kept
                f.write(chunk)
                bar.update(len(chunk))
    if part.stat().st_size != size:
        raise OSError(f"{path.name}: got {part.stat().st_size} of {size} bytes")
    part.replace(path)
