"""`--precision auto`: per op group, the cheapest modeled precision whose accuracy, measured on a
calibration set against the fp32 verification mode, stays within a stated budget; the choice is
written to a small JSON file and reused.

Why: which precision a model tolerates is a property of its weights (docs/accuracy.md: int8 keeps
gemma-3-270m's perplexity, int4 does not), so it is measured, once per model, not guessed.

Budget (the defaults, stated once, in `Budget`): decoders: perplexity at most +2% over fp32 and
next-token (argmax) agreement with fp32 at least 95%; Whisper: WER at most +0.5 points over fp32;
embedders: cosine to fp32 >= 0.999 (stated for completeness; embedders have no cheaper mode than
bf16, so auto is not offered for them). Measurements are engine/accuracy.py's (one place):
decoders teacher-force the first `tokens` tokens of CPython's pydoc_data "exceptions" topic;
Whisper transcribes the speech set shipped in torch_xdna/engine/asr/speech (espeak-ng).

Groups: a decoder's op groups are the precision policy's site kinds (attention projections, MLP,
embedding + head; PrecisionPolicy takes one precision per kind, not per layer index). Whisper's
are the encoder (layers + cross K/V) and the decoder (layers + output projection), each bf16 or
int8 (kernels/blocks/whisper.py; fp32 is the verification mode).

Search (greedy, at most len(ladder) + 2 * groups measured mixes): the ladder is the model's NPU
precisions ordered by the cost model's modeled time (cheapest first).
  1. Uniform: measure each precision of the ladder, cheapest first, until one is within budget
     (u). None within budget (not even bf16): refuse by falling back to uniform bf16, the most
     accurate NPU precision, with a one-line warning (`within_budget: false` in the file).
  2. Mix (when a cheaper uniform c failed; c = the most accurate of those): lower each group
     alone to c, the rest at u (its sensitivity); then, from all groups at c, promote the most
     sensitive groups to u one at a time, measuring each.
  3. Pick the cheapest (modeled) measured assignment within budget.
Measurements stored for the same model and calibration set under another budget are reused
(re-scored against the new budget), so changing the budget measures only what is missing.

The file: next to the model (FILE.gguf -> FILE.gguf.xdna-precision.json; a directory ->
DIR/xdna-precision.json), or <cache root>/precision-auto/<digest>.json when that place is not
writable. Entries are keyed by the model's content digest + budget + calibration set + search
version; a hit is reused without measuring. The file only selects among valid precisions (each
re-checked when read), so an edited file can change accuracy, never what code runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from torch_xdna.engine import accuracy as acc
from torch_xdna.kernels.blocks.weights import PRECISIONS, WHISPER_PRECISIONS
from torch_xdna.kernels.blocks.whisper import WHISPER_GROUPS
from torch_xdna.runtime.cachedir import cache_root, loads_bounded, publish

SEARCH_VERSION = 2                  # 2: Whisper's groups are encoder and decoder
DECODER_GROUPS = ("attention", "mlp", "head")
DECODER_LADDER = ("int4", "int8", "bfp16", "bf16")
CALIBRATION_TOKENS = 128
FILE_NAME = "xdna-precision.json"
MAX_FILE_BYTES = 1 << 20
Log = Callable[[str], None]


@dataclass(frozen=True)
class Budget:
    """The accuracy a chosen precision may give up against fp32 (the defaults are the stated
    budget). perplexity: relative rise; agreement: minimum share; wer: absolute rise; cosine:
    minimum (embedders)."""

    perplexity: float = 0.02
    agreement: float = 0.95
    wer: float = 0.005
    cosine: float = 0.999

    @classmethod
    def parse(cls, text: "str | Budget | None") -> "Budget":
        """'perplexity=3%,agreement=90%,wer=1%' (numbers in percent; wer in points; cosine
        plain, e.g. cosine=0.995); unnamed fields keep their defaults."""
        if isinstance(text, Budget):
            return text
        out: dict[str, float] = {}
        for part in (text or "").split(","):
            if not part.strip():
                continue
            name, _, val = part.partition("=")
            name, val = name.strip().lower(), val.strip().rstrip("%")
            if name not in cls.__dataclass_fields__ or not val:
                raise ValueError(f"precision budget {part.strip()!r}: use perplexity=P%, "
                                 "agreement=A%, wer=W% or cosine=C, comma-separated")
            try:
                v = float(val)
            except ValueError:
                raise ValueError(f"precision budget {part.strip()!r}: {val!r} is not a number")
            out[name] = v if name == "cosine" else v / 100
        return cls(**out)

    def ident(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in asdict(self).items())

    def used(self, m: dict) -> float:
        """The share of the budget a measurement uses: <= 1 is within budget (the worst
        metric decides)."""
        def share(excess: float, allowed: float) -> float:   # allowed <= 0: a hard bound
            return excess / allowed if allowed > 0 else (0.0 if excess <= allowed else float("inf"))
        if "wer_rise" in m:
            return share(m["wer_rise"], self.wer)
        return max(share(m["perplexity_rise"], self.perplexity),
                   share(1 - m["agreement_with_fp32"], 1 - self.agreement))


@dataclass
class Choice:
    """What auto chose: precision per group, whether it is within budget, and the evidence."""

    precision: dict[str, str]
    within_budget: bool
    budget: dict
    calibration: str
    digest: str
    modeled: dict[str, float]
    measured: list[dict] = field(default_factory=list)
    reference: dict = field(default_factory=dict)
    path: str | None = None
    reused: bool = False

    def policy(self) -> "str | dict[str, str]":
        """The precision as the loaders take it: one mode, or a per-site mapping."""
        vals = set(self.precision.values())
        return next(iter(vals)) if len(vals) == 1 else dict(self.precision)


# -- the file ---------------------------------------------------------------------------------
def model_digest(path: Path) -> str:
    """sha256 over the model's bytes (a file, or a directory's regular files by name)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", FILE_NAME)))
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def choice_paths(model: Path, digest: str) -> list[Path]:
    """Where the choice is kept, in order of preference: beside the model, then the cache."""
    beside = model / FILE_NAME if model.is_dir() else model.with_name(model.name + "." + FILE_NAME)
    return [beside, cache_root() / "precision-auto" / f"{digest[:32]}.json"]


def entry_key(digest: str, budget: Budget, calibration: str) -> str:
    raw = f"v{SEARCH_VERSION}|{digest}|{budget.ident()}|{calibration}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _read(path: Path) -> dict:
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return {}
        doc = loads_bounded(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and isinstance(doc.get("entries"), dict) else {}


def find_choice(model: Path, digest: str, key: str, groups: tuple[str, ...],
                allowed: tuple[str, ...]) -> Choice | None:
    """A stored choice for this key naming a valid precision for each group, or None."""
    for path in choice_paths(model, digest):
        e = _read(path).get("entries", {}).get(key)
        if not isinstance(e, dict) or not isinstance(e.get("precision"), dict):
            continue
        if set(e["precision"]) != set(groups) or not all(
                isinstance(p, str) and p in allowed for p in e["precision"].values()):
            continue
        try:
            c = Choice(**{k: e[k] for k in Choice.__dataclass_fields__ if k in e})
        except TypeError:
            continue
        c.path, c.reused = str(path), True
        return c
    return None


def known_measurements(model: Path, digest: str, calibration: str) -> tuple[list[dict], dict]:
    """Measurements stored under any budget for this model and calibration set (a new budget
    re-measures only the mixes they lack), and their fp32 reference figures."""
    measured: list[dict] = []
    reference: dict = {}
    for path in choice_paths(model, digest):
        for e in _read(path).get("entries", {}).values():
            if not (isinstance(e, dict) and e.get("digest") == digest
                    and e.get("calibration") == calibration and isinstance(e.get("measured"), list)):
                continue
            measured += [m for m in e["measured"] if isinstance(m, dict)
                         and isinstance(m.get("precision"), dict)]
            reference = reference or (e.get("reference") if isinstance(e.get("reference"), dict)
                                      else {})
    return measured, reference


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def save_choice(model: Path, key: str, choice: Choice, log: Log) -> Path | None:
    """Write the entry beside the model, else in the cache dir (atomic replace); the path."""
    for path in choice_paths(model, choice.digest):
        doc = _read(path) or {"what": "xdna --precision auto choices (torch_xdna/engine/"
                                      "precision_auto.py); delete to measure again",
                              "entries": {}}
        entry = {k: v for k, v in asdict(choice).items() if k not in ("path", "reused")}
        doc["entries"][key] = entry
        data = json.dumps(doc, indent=1).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            publish(path, lambda fd, _: _write_all(fd, data), mode=0o644)
            choice.path = str(path)
            return path
        except OSError as e:
            log(f"cannot write {path} ({e.strerror or e}); trying the next place")
    return None


# -- the search -------------------------------------------------------------------------------
Assignment = tuple[tuple[str, str], ...]


def greedy_search(groups: tuple[str, ...], ladder: tuple[str, ...],
                  measure: Callable[[dict[str, str]], dict], cost: Callable[[dict[str, str]], float],
                  budget: Budget, log: Log, known: list[dict] = ()
                  ) -> tuple[dict[str, str], bool, list[dict]]:
    """The search in the module docstring: (chosen assignment, within budget, every
    measurement). measure(assignment) -> metrics; cost(assignment) -> modeled ms; known:
    earlier measurements (any budget) reused instead of measuring again."""
    seen: dict[Assignment, dict] = {}
    for m in known:
        a = m["precision"]
        if set(a) == set(groups) and all(a[g] in ladder for g in groups):
            try:
                seen[tuple(sorted(a.items()))] = {**m, "budget_used": budget.used(m),
                                                   "modeled_ms": cost(a)}
            except (KeyError, TypeError):            # an entry from another version: measure
                pass

    def run(a: dict[str, str]) -> dict:
        k = tuple(sorted(a.items()))
        if k not in seen:
            m = measure(a)
            m.update(precision=dict(a), budget_used=budget.used(m), modeled_ms=cost(a))
            seen[k] = m
            log(f"{_label(a)}: {_metrics_text(m)}, {m['budget_used']:.0%} of the budget, "
                f"{m['modeled_ms']:.2f} ms modeled")
        return seen[k]

    def uniform(p: str) -> dict[str, str]:
        return dict.fromkeys(groups, p)

    failed, top = [], None
    for p in ladder:
        if run(uniform(p))["budget_used"] <= 1:
            top = p
            break
        failed.append(p)
    if top is None:
        return uniform(ladder[-1]), False, list(seen.values())
    if failed and len(groups) > 1:
        c = min(failed, key=lambda p: seen[tuple(sorted(uniform(p).items()))]["budget_used"])
        sens = {g: run({**uniform(top), g: c})["budget_used"] for g in groups}
        order = sorted(groups, key=lambda g: -sens[g])
        for k in range(1, len(groups)):
            a = {g: top if g in order[:k] else c for g in groups}
            if run(a)["budget_used"] <= 1:
                break
    ok = [m for m in seen.values() if m["budget_used"] <= 1]
    best = min(ok, key=lambda m: (m["modeled_ms"], m["budget_used"]))
    return best["precision"], True, list(seen.values())


def _label(a: dict[str, str]) -> str:
    vals = set(a.values())
    return next(iter(vals)) if len(vals) == 1 else ", ".join(f"{g} {p}" for g, p in a.items())


def _metrics_text(m: dict) -> str:
    if "wer" in m:
        return f"WER {m['wer']:.1%} (+{m['wer_rise'] * 100:.1f} pt)"
    return (f"ppl {m['perplexity']:.2f} ({m['perplexity_rise']:+.1%}), agreement "
            f"{m['agreement_with_fp32']:.1%}")


def stderr_log(s: str) -> None:
    print(f"xdna: precision auto: {s}", file=sys.stderr)


def _choose(model: Path, kind: str, budget: Budget, calibration: str, groups: tuple[str, ...],
            allowed: tuple[str, ...],
            search: Callable[[list[dict], dict], tuple[dict, bool, list[dict], dict, dict]],
            log: Log) -> Choice:
    """Reuse the stored choice for (digest, budget, calibration), else search and store it."""
    digest = model_digest(model)
    key = entry_key(digest, budget, calibration)
    hit = find_choice(model, digest, key, groups, allowed)
    if hit is not None:
        log(f"reusing {_label(hit.precision)} from {hit.path}")
        return hit
    log(f"choosing {kind} precisions on {calibration} (budget {budget.ident()}; measured "
        "once per model and calibration set, then reused)")
    chosen, within, measured, reference, modeled = search(*known_measurements(model, digest,
                                                                              calibration))
    choice = Choice(chosen, within, asdict(budget), calibration, digest, modeled, measured,
                    reference)
    if not within:
        print(f"xdna: warning: precision auto: no precision of {model.name} is within the budget "
              f"({budget.ident()}); using {_label(chosen)}, the most accurate NPU precision",
              file=sys.stderr)
    save_choice(model, key, choice, log)
    log(f"chose {_label(chosen)}" + (f"; saved to {choice.path}" if choice.path else ""))
    return choice


def choose_decoder(model: str | Path, load: acc.Loader, *, budget: "Budget | str | None" = None,
                   tokens: int = CALIBRATION_TOKENS, log: Log = stderr_log) -> Choice:
    """The decoder's precision per op group (module docstring). load(precision) -> an Engine
    of the model (a mode or a per-site mapping), e.g. load_decoder with a small max_context."""
    from torch_xdna.engine.llm.estimate import estimate, resolve_spec
    model, budget = Path(model), Budget.parse(budget)
    _, name = acc.reference_text()
    calibration = f"{name}, first {tokens} tokens"

    def search(known: list[dict], known_ref: dict):
        _, spec = resolve_spec(str(model))
        modeled_cache: dict[Assignment, float] = {}

        def cost(a: dict[str, str]) -> float:
            k = tuple(sorted(a.items()))
            if k not in modeled_cache:
                modeled_cache[k] = estimate(spec, dict(a), tokens)["modeled_decode_ms_per_token"]
            return modeled_cache[k]

        ref: dict = {}

        def measure(a: dict[str, str]) -> dict:
            if not ref:                              # fp32, once, when something is measured
                ref["logits"], ref["ids"], _ = acc.decoder_run(load, "fp32", tokens)
                ref["perplexity"] = acc.decoder_scores(ref["logits"], ref["ids"],
                                                       ref["logits"])["perplexity"]
            logits, _, run_ms = acc.decoder_run(load, dict(a), tokens)
            m = acc.decoder_scores(logits, ref["ids"], ref["logits"])
            return {**m, "perplexity_rise": m["perplexity"] / ref["perplexity"] - 1,
                    "run_modeled_ms_per_token": run_ms}
        ladder = tuple(sorted(DECODER_LADDER, key=lambda p: cost(dict.fromkeys(DECODER_GROUPS, p))))
        chosen, within, measured = greedy_search(DECODER_GROUPS, ladder, measure, cost, budget,
                                                 log, known)
        modeled = {"chosen_ms_per_token": cost(chosen),
                   **{f"{p}_ms_per_token": cost(dict.fromkeys(DECODER_GROUPS, p)) for p in ladder},
                   "context": tokens}
        reference = ({"perplexity": ref["perplexity"], "tokens": len(ref["ids"])} if ref
                     else known_ref)
        return chosen, within, measured, reference, modeled
    return _choose(model, "decoder", budget, calibration, DECODER_GROUPS,
                   tuple(p for p in PRECISIONS if p != "fp32"), search, log)


def choose_whisper(model: str | Path, load: acc.Loader, options, *,
                   budget: "Budget | str | None" = None, speech: Path | None = None,
                   log: Log = stderr_log) -> Choice:
    """Whisper's precision (module docstring). load(precision) -> a Transcriber; options: its
    TranscribeOptions (language set)."""
    from torch_xdna.engine.asr.estimate import estimate_whisper
    from torch_xdna.models.speech.whisper import read_whisper
    model, budget = Path(model), Budget.parse(budget)
    speech = Path(speech or acc.SPEECH_SET)
    clips = acc.load_speech_set(speech)
    calibration = f"speech set {speech.name} ({len(clips)} clips, " + hashlib.sha256(
        (speech / "transcripts.json").read_bytes()).hexdigest()[:12] + ")"
    nodes = tuple(p for p in WHISPER_PRECISIONS if p != "fp32")

    def run(p) -> dict:
        asr = load(p)
        try:
            return acc.speech_errors(asr, clips, options)
        finally:
            asr.close()

    def search(known: list[dict], known_ref: dict):
        spec = read_whisper(model).spec
        ref: dict = {}

        def cost(a: dict[str, str]) -> float:     # a 30-s window of TOKENS_PER_WINDOW tokens
            return estimate_whisper(spec, dict(a))["modeled_ms_per_window"]

        def measure(a: dict[str, str]) -> dict:
            if not ref:                              # fp32 once (or stored), when needed
                ref.update(known_ref if "wer" in known_ref else run("fp32"))
            m = run(dict(a))
            return {**m, "wer_rise": m["wer"] - ref["wer"]}
        ladder = tuple(sorted(nodes, key=lambda p: cost(dict.fromkeys(WHISPER_GROUPS, p))))
        chosen, within, measured = greedy_search(WHISPER_GROUPS, ladder, measure, cost, budget,
                                                 log, known)
        modeled = {"chosen_ms_per_window": cost(chosen),
                   **{f"{p}_ms_per_window": cost(dict.fromkeys(WHISPER_GROUPS, p))
                      for p in WHISPER_PRECISIONS}}
        return chosen, within, measured, ref or known_ref, modeled
    return _choose(model, "Whisper", budget, calibration, WHISPER_GROUPS, nodes, search, log)
