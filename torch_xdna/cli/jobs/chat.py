"""`xdna chat DIR|URL`: an interactive terminal chat, with a local decoder (a Hugging Face
directory or a .gguf file, on the (simulated by default) NPU) or with a running server
(`xdna serve`, or any OpenAI-compatible one) through its streaming /v1/chat/completions.

Each line read is one user message; the answer streams to stdout as it is generated and the
conversation is kept for the next turn. Works with stdin piped (no prompt is printed then), so
`printf 'hi\\n/exit\\n' | xdna chat DIR` is a script. Ctrl-C stops an answer (the part shown
is kept); /exit, /bye or end of input leave."""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Iterator

from torch_xdna.choices import DEFAULT_KV_DTYPE, KV_DTYPES
from torch_xdna.cli.args import CliError, add_command, add_decoder_precision, positive_int
from torch_xdna.cli.jobs.generate import finite_float, stats_line
from torch_xdna.runtime import settings

HELP = """\
commands:
  /exit, /quit, /bye   leave (or end the input: Ctrl-D)
  /clear               forget the conversation (the system message stays)
  /help                this list
  \"\"\"                  start or end a message of several lines
Ctrl-C stops the answer being written."""
EXIT = ("/exit", "/quit", "/bye")


def register(subparsers) -> None:
    p = add_command(
        subparsers, "chat", help="interactive chat with a local model or a server",
        description="Chat in the terminal with a local decoder (Hugging Face directory or .gguf "
                    "file, run on the NPU: simulated by default) or with a server "
                    "(http://HOST:PORT: xdna serve or any OpenAI-compatible one). One line is one "
                    "message; type /help for the commands.\n\n" + HELP,
        epilog="examples:\n  xdna chat ./Qwen3-0.6B\n"
               "  xdna chat http://127.0.0.1:8000 --model chat --system 'Answer briefly.'\n"
               "  printf 'hello\\n/exit\\n' | xdna chat ./Qwen3-0.6B --max-tokens 32")
    p.add_argument("target", metavar="DIR|URL", help="model directory or .gguf file, or the "
                                                     "URL of a server")
    p.add_argument("--model", help="with a URL: the served model to talk to (default: the "
                                   "first chat model of /v1/models)")
    p.add_argument("--api-key", default=settings.get("XDNA_API_KEY"),
                   help="with a URL: the server's key (default: $XDNA_API_KEY)")
    p.add_argument("--system", help="system message")
    p.add_argument("--max-tokens", type=positive_int, default=512,
                   help="longest answer in tokens (default 512)")
    p.add_argument("--temperature", type=finite_float, default=0.0,
                   help="0 = greedy (default)")
    p.add_argument("--top-p", type=finite_float, default=1.0, help="in (0, 1]; 1 = off (default)")
    p.add_argument("--top-k", type=int, default=0, help=">= 0; 0 = off (default)")
    p.add_argument("--seed", type=int, help="sampling seed")
    p.add_argument("--no-think", action="store_true",
                   help="switch thinking models' reasoning off (enable_thinking=false)")
    p.add_argument("--verbose", action="store_true",
                   help="after each answer, a stats line on stderr (tokens; modeled NPU and "
                        "measured host figures for a local model)")
    g = p.add_argument_group("local model")
    add_decoder_precision(g, "bf16, or a .gguf file's own blocks")
    g.add_argument("--max-context", type=positive_int, metavar="TOKENS",
                   help="KV cache capacity (default: the model's, capped by memory)")
    g.add_argument("--kv-dtype", choices=KV_DTYPES, default=DEFAULT_KV_DTYPE)
    g.add_argument("--tokenizer", metavar="DIR", help="tokenizer.json and chat template from DIR")
    p.set_defaults(func=run)


class LocalChat:
    """Turns on a decoder loaded in this process."""

    def __init__(self, args: argparse.Namespace):
        from torch_xdna.engine.llm.generate import load_decoder
        self.config = generation_config(args)
        self.engine = load_decoder(args.target, args.precision, max_context=args.max_context,
                                   tokenizer_dir=args.tokenizer, kv_dtype=args.kv_dtype,
                                   quiet=not sys.stderr.isatty(), budget=args.precision_budget)
        self.name = self.engine.model_name
        self.stats = ""

    def stream(self, messages: list[dict]) -> Iterator[tuple[str, str]]:
        """("content", text) pieces of the answer (the model's own text, think block included)."""
        chunks = self.engine.generate(messages, self.config)
        try:
            for chunk in chunks:
                if chunk.text:
                    yield "content", chunk.text
                if chunk.stats is not None:
                    self.stats = stats_line(chunk.stats, self.engine.decoder.dev.backend)
        finally:
            chunks.close()                        # Ctrl-C: the engine stops generating

    def close(self) -> None:
        self.engine.close()


class RemoteChat:
    """Turns through a server's streaming /v1/chat/completions (stdlib HTTP: no extra package)."""

    def __init__(self, args: argparse.Namespace):
        base = args.target.rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.key = args.api_key or None
        self.params = {"max_tokens": args.max_tokens, "temperature": args.temperature,
                       "top_p": args.top_p}
        if args.top_k:
            self.params["top_k"] = args.top_k
        if args.seed is not None:
            self.params["seed"] = args.seed
        if args.no_think:
            self.params["chat_template_kwargs"] = {"enable_thinking": False}
        models = json.load(self._open("GET", "/v1/models")).get("data", [])
        chat = [m["id"] for m in models if m.get("kind", "chat") == "chat"]
        if args.model is None and not chat:
            raise CliError(f"{self.base} serves no chat model; start it with --model DIR "
                           f"(a decoder)")
        known = {m["id"] for m in models} | {a for m in models for a in m.get("aliases", ())}
        if args.model is not None and args.model not in known:
            raise CliError(f"{self.base} does not serve {args.model!r}; it serves "
                           f"{', '.join(chat) or 'no chat model'}")
        self.name = args.model or chat[0]
        self.stats = ""

    def _open(self, method: str, path: str, body: dict | None = None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        req = urllib.request.Request(self.base + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            return urllib.request.urlopen(req, timeout=600)
        except urllib.error.HTTPError as e:
            raise CliError(f"{self.base}{path}: {e.code} {_error_message(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CliError(f"cannot reach {self.base} ({reason}); is `xdna serve` running "
                           f"there?") from None

    def stream(self, messages: list[dict]) -> Iterator[tuple[str, str]]:
        """("reasoning" | "content", text) pieces from the server's SSE chunks."""
        t0 = time.perf_counter()
        body = {"model": self.name, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, **self.params}
        with self._open("POST", "/v1/chat/completions", body) as resp:
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise CliError(chunk["error"].get("message", str(chunk["error"])))
                if chunk.get("usage"):
                    u = chunk["usage"]
                    self.stats = (f"[{u['prompt_tokens']} prompt + {u['completion_tokens']} "
                                  f"generated tokens in {time.perf_counter() - t0:.2f} s "
                                  f"(measured on this host, through the server)]")
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta") or {}
                    if delta.get("reasoning_content"):
                        yield "reasoning", delta["reasoning_content"]
                    if delta.get("content"):
                        yield "content", delta["content"]

    def close(self) -> None:
        pass


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        err = json.loads(e.read()).get("error")
        return err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        return e.reason


def read_message(tty: bool) -> str | None:
    """The next message (several lines between \"\"\" marks); None at the end of the input."""
    def line(prompt: str) -> str | None:
        try:
            return input(prompt if tty else "")
        except EOFError:
            return None
    first = line(">>> ")
    if first is None or not first.lstrip().startswith('"""'):
        return first
    parts, text = [], first.lstrip()[3:]
    while not text.rstrip().endswith('"""'):
        parts.append(text)
        text = line("... ")
        if text is None:
            return "\n".join(parts)
    parts.append(text.rstrip()[:-3])
    return "\n".join(parts).strip("\n")


def answer(chat, messages: list[dict], out) -> str:
    """Stream one answer to `out`; its content (Ctrl-C keeps what was written)."""
    content, thinking = [], False
    try:
        for kind, text in chat.stream(messages):
            if kind == "reasoning" and not thinking:
                out.write("<think>\n")
                thinking = True
            elif kind == "content" and thinking:
                out.write("\n</think>\n\n")
                thinking = False
            if kind == "content":
                content.append(text)
            out.write(text)
            out.flush()
    except KeyboardInterrupt:
        out.write("\n")
        print("[stopped]", file=sys.stderr)
    if thinking:
        out.write("\n</think>\n")
    out.write("\n")
    out.flush()
    return "".join(content)


def generation_config(args: argparse.Namespace):
    """The sampling options as the engine takes them, checked (before a model loads or a server
    is asked)."""
    from torch_xdna.engine.llm.generate import GenerationConfig
    config = GenerationConfig(max_tokens=args.max_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                              chat_kwargs=(("enable_thinking", False),) if args.no_think else ())
    config.sampling().validate()
    return config


def run(args: argparse.Namespace) -> int:
    generation_config(args)
    remote = args.target.startswith(("http://", "https://"))
    chat = RemoteChat(args) if remote else LocalChat(args)
    tty = sys.stdin.isatty()
    if tty:
        print(f"chatting with {chat.name} ({'server ' + chat.base if remote else 'local'}); "
              f"/help for commands, /exit to leave", file=sys.stderr)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    try:
        while True:
            try:
                text = read_message(tty)
            except KeyboardInterrupt:
                print("\n(/exit or Ctrl-D to leave)", file=sys.stderr)
                continue
            if text is None or text.strip() in EXIT:
                return 0
            if not text.strip():
                continue
            if text.strip() == "/clear":
                history.clear()
                print("(conversation cleared)", file=sys.stderr)
                continue
            if text.strip() in ("/help", "/?"):
                print(HELP, file=sys.stderr)
                continue
            history.append({"role": "user", "content": text})
            try:
                reply = answer(chat, system + history, sys.stdout)
            except (CliError, ValueError) as e:     # a refused turn: say why, keep chatting
                history.pop()
                print(f"xdna chat: error: {' '.join(str(e).split())}", file=sys.stderr)
                continue
            history.append({"role": "assistant", "content": reply})
            if args.verbose and chat.stats:
                print(chat.stats, file=sys.stderr)
    finally:
        chat.close()
