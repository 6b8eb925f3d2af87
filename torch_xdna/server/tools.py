"""Tool calling: the model's own convention for offering tools and for writing calls, and the
parser that turns its output back into OpenAI `tool_calls`.

Conventions (picked from the chat template's text):
  hermes  -- Qwen2.5/Qwen3 (and Hermes-style templates): the template renders `tools`; calls are
             `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, content may precede.
  llama3  -- Llama 3.1/3.2/3.3 templates: the template renders `tools`; a call is the JSON object
             `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`), calls
             separated by `;`, and the whole answer is the call.
  prompt  -- templates that know no tools (Gemma 3 has no tool tokens): the tools are described in
             a system message and the model answers with a fenced block
             ```tool_call\\n{"name": ..., "arguments": {...}}\\n``` ; tool results are sent back as
             user turns holding ```tool_output\\n...\\n```. (Google's Gemma function-calling
             guide: describe the functions in the prompt, ask for a fixed output format.)
Parsing fails soft: output that does not hold a well-formed call is returned as plain content.
tool_choice "required" / a named function constrains the output to calls of that convention with
a grammar (engine/llm/constrained.py), so it always parses: "required" with parallel_tool_calls (the
default) allows up to MAX_PARALLEL_CALLS calls, a named function or parallel_tool_calls false
exactly one.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

CONVENTIONS = ("hermes", "llama3", "prompt")


def convention_of(template: str | None) -> str:
    """The tool convention a chat template implies."""
    t = template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3"
    return "prompt"


@dataclass
class ToolCall:
    name: str
    arguments: str                          # a JSON object, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function",
             "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


# --- prompts --------------------------------------------------------------------------------------
PROMPT_INSTRUCTIONS = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n\n"
    "To call a function, answer with only this block, and nothing else:\n"
    "```tool_call\n{{\"name\": \"<function name>\", \"arguments\": {{<arguments as JSON>}}}}\n```\n"
    "Function results come back in a ```tool_output``` block. If no function is needed, answer "
    "normally.")


def render_messages(messages: list[dict], tools: list[dict] | None,
                    convention: str) -> tuple[list[dict], dict]:
    """OpenAI messages (+ tools) -> (messages for the chat template, extra template variables).
    Tool-aware templates get `tools` and structured tool calls; the prompt convention gets the
    tools as a system message and tool turns rewritten as text."""
    out: list[dict] = []
    for m in messages:
        m = dict(m)
        calls = m.get("tool_calls") or []
        if convention == "prompt":
            if calls:
                blocks = [fence("tool_call", json.dumps({"name": c["function"]["name"],
                                                          "arguments": _args(c)}))
                          for c in calls]
                m = {"role": "assistant", "content": ((m.get("content") or "") + "\n".join(blocks))}
            elif m["role"] == "tool":
                m = {"role": "user", "content": fence("tool_output", m.get("content") or "")}
        elif calls:
            m["tool_calls"] = [{"id": c.get("id"), "type": "function",
                                "function": {"name": c["function"]["name"],
                                             "arguments": _args(c)}} for c in calls]
        out.append({k: v for k, v in m.items() if v is not None or k == "content"})
    if not tools:
        return out, {}
    if convention == "prompt":
        text = PROMPT_INSTRUCTIONS.format(tools="\n".join(json.dumps(t["function"])
                                                           for t in tools))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
        return out, {}
    return out, {"tools": tools}


def _args(call: dict) -> Any:
    """A call's arguments as templates want them: a dict when they are a JSON object."""
    a = call["function"].get("arguments")
    if isinstance(a, str):
        try:
            v = json.loads(a)
            return v if isinstance(v, dict) else a
        except json.JSONDecodeError:
            return a
    return a if a is not None else {}


def fence(tag: str, body: str) -> str:
    return f"```{tag}\n{body}\n```"


# --- parsing --------------------------------------------------------------------------------------
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_FENCE = re.compile(r"```tool_call\s*\n(.*?)\n?```", re.S)
MARKERS = {"hermes": "<tool_call>", "prompt": "```tool_call", "llama3": "<|python_tag|>"}


def _call_from(obj: Any, keys=("arguments", "parameters")) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in keys if k in obj), {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


def parse_tool_calls(text: str, convention: str,
                     names: set[str] | None = None) -> tuple[str | None, list[ToolCall]]:
    """Model output -> (content or None, tool calls). Anything malformed -> (text, []): the
    answer is then plain content. `names`: the offered tools (a call of another name is not one)."""
    calls: list[ToolCall] = []
    content = text
    if convention in ("hermes", "prompt"):
        pat = _HERMES if convention == "hermes" else _FENCE
        found = list(pat.finditer(text))
        if not found:
            return text, []
        for m in found:
            c = _call_from(_json(m.group(1)))
            if c is None:
                return text, []
            calls.append(c)
        content = pat.sub("", text)
    else:                                   # llama3: the whole answer is the call(s)
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        for part in _split_top_level(body, ";"):
            c = _call_from(_json(part.strip()))
            if c is None:
                return text, []
            calls.append(c)
        content = ""
    if names is not None and any(c.name not in names for c in calls):
        return text, []
    content = content.strip()
    return (content or None), calls


def _split_top_level(s: str, sep: str) -> list[str]:
    """Split at `sep` outside JSON strings and brackets."""
    parts, depth, start, in_str, esc = [], 0, 0, False, False
    for i, ch in enumerate(s):
        if in_str:
            esc = (ch == "\\") and not esc
            if ch == '"' and not esc:
                in_str = False
            elif ch != "\\":
                esc = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return [p for p in parts if p.strip()]


class ToolStream:
    """Streaming split of model output into content deltas and, at the end, tool calls: text is
    passed on until a call may be starting, then held; finish() parses what was held (plain
    content again if it is not a well-formed call)."""

    def __init__(self, convention: str, names: set[str] | None = None):
        self.conv, self.names = convention, names
        self.marker = MARKERS[convention]
        self.text = ""            # everything generated
        self.sent = 0             # chars of it emitted as content
        self.holding = False

    def feed(self, piece: str) -> str:
        """New text -> content safe to emit now."""
        self.text += piece
        if self.holding:
            return ""
        if self.conv == "llama3":
            head = self.text.lstrip()
            if not head:
                return ""
            if head.startswith("{") or head.startswith(self.marker) \
                    or self.marker.startswith(head):
                self.holding = head.startswith("{") or head.startswith(self.marker)
                return ""
            return self._emit(len(self.text))
        i = self.text.find(self.marker, self.sent)
        if i >= 0:
            self.holding = True
            return self._emit(i)
        keep = 0                              # a tail that may begin the marker
        for k in range(min(len(self.marker) - 1, len(self.text) - self.sent), 0, -1):
            if self.text.endswith(self.marker[:k]):
                keep = k
                break
        return self._emit(len(self.text) - keep)

    def _emit(self, upto: int) -> str:
        out = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content still to emit, tool calls)."""
        rest = self.text[self.sent:]
        if not self.holding:
            self.sent = len(self.text)
            return rest, []
        content, calls = parse_tool_calls(rest, self.conv, self.names)
        self.sent = len(self.text)
        if not calls:
            return rest, []
        return content or "", calls


# --- constraining tool_choice required / named ----------------------------------------------------
def call_schema(tools: list[dict], convention: str) -> dict:
    """JSON schema of one call of any of `tools` in this convention's object shape."""
    key = "parameters" if convention == "llama3" else "arguments"
    options = []
    for t in tools:
        f = t["function"]
        params = f.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object",
                        "properties": {"name": {"const": f["name"]}, key: params},
                        "required": ["name", key], "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}


MAX_PARALLEL_CALLS = 4      # a forced answer holds at most this many calls (a weak model
#                             could otherwise repeat calls until max_tokens)


def call_grammar(tools: list[dict], convention: str, max_calls: int = 1) -> str:
    """A Lark grammar (llguidance) whose language is 1..max_calls calls in this convention
    (parallel tool calls: blocks on their own lines; llama3: objects separated by ';')."""
    from torch_xdna.engine.llm.constrained import json_lark
    if max_calls < 1:
        raise ValueError(f"max_calls must be >= 1, got {max_calls}")
    body = json_lark(call_schema(tools, convention))
    if convention == "hermes":
        block, sep = '"<tool_call>\\n" call "\\n</tool_call>"', '"\\n"'
    elif convention == "prompt":
        block, sep = '"```tool_call\\n" call "\\n```"', '"\\n"'
    else:
        block, sep = "call", '"; "'
    more = ""
    for _ in range(max_calls - 1):           # nested optionals: block (sep block (...)?)?
        more = f"({sep} {block} {more})?"
    return f"start: {block} {more}\ncall: {body}\n"
