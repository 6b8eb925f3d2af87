"""Request models of the OpenAI-compatible API, their parsing (parse: body -> model, or a 400
in OpenAI's words) and its error JSON shape.

Unknown request fields are ignored, as llama.cpp's server and vLLM do (LiteLLM, LangChain and Open
WebUI send extras such as `metadata`, `store`, `typical_p`): parse() drops them and logs one warning
per field name. Known fields keep strict types and bounds (a wrong type is a 400). Parameters
OpenAI defines but we cannot honor are accepted only at their neutral value.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      field_validator, model_validator)


log = logging.getLogger("torch_xdna.server")


class APIError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": scrub_paths(message), "type": type, "param": param,
                      "code": code}}


# an absolute (or ~) filesystem path with at least two components; API routes (/v1/...) are kept
_PATH = re.compile(r"(?<![\w.:/-])~?/(?!v1/)(?:[^\s'\"`()<>,;:/]+/)+([^\s'\"`()<>,;:/]*)")


def scrub_paths(message: str) -> str:
    """Drop server directories from a client-facing message, keeping the file name:
    "/home/u/models/qwen/config.json: ..." -> ".../config.json: ..."."""
    return _PATH.sub(lambda m: ".../" + m.group(1), message)


class _Strict(BaseModel):
    # NaN/Infinity are JSON extensions Python's parser accepts; no parameter here means anything
    # with them, and they would reach the sampler as non-finite probabilities
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1      # what torch.Generator.manual_seed accepts
MAX_N = 16                                    # choices per request (each one decodes in turn)


TokenIds = list[int]


class EmbeddingRequest(_Strict):
    """POST /v1/embeddings. `model` may be omitted (the server's first embedding model)."""

    input: str | list[str] | TokenIds | list[TokenIds]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    user: str | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    # sampling extras llama.cpp's server and vLLM take (openai clients send them in extra_body)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list):
            if len(v) > 4:
                raise ValueError("at most 4 stop sequences")
            if any(not s for s in v):
                raise ValueError("stop sequences must be non-empty strings")
        elif v == "":
            raise ValueError("stop sequences must be non-empty strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        for k, b in (v or {}).items():
            if not k.lstrip("-").isdigit():
                raise ValueError(f"'logit_bias' keys must be token ids (integers as strings), "
                                 f"got {k!r}")
            if not -100 <= b <= 100:
                raise ValueError(f"'logit_bias' values must be in [-100, 100], got {b} for {k}")
        return v

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), float(b)) for k, b in (self.logit_bias or {}).items())

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


def _part_tag(v: Any) -> str | None:
    """The content-part branch by its `type`, so a text part's unknown field is reported (and
    dropped) for the text branch only, never as a stray of the image branch."""
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return {"text": "text_part", "image_url": "image_part"}.get(t, "text_part")


ContentPart = Annotated[
    Annotated[TextPart, Tag("text_part")] | Annotated[ImagePart, Tag("image_part")],
    Discriminator(_part_tag)]


def request_image(source: str, where: str, data_url: bool = True):
    """A PIL image from a request: an OpenAI image_url (a data: URL; http(s) URLs are refused,
    nothing is downloaded) or an Ollama `images` entry (bare base64). APIError 400, one line
    naming `where`, when it is not base64 or not an image."""
    import base64
    import binascii
    from torch_xdna.models.vision import ImageInputError, decode_data_url, open_image
    try:
        if data_url:
            if source.startswith(("http://", "https://")):
                raise ImageInputError(f"{where}: http(s) image URLs are not fetched (this server "
                                      f"downloads nothing); send the image inline as a data URL "
                                      f"(data:image/png;base64,...)")
            return decode_data_url(source, where)
        try:
            data = base64.b64decode(source, validate=True)
        except (binascii.Error, ValueError):
            raise ImageInputError(f"{where}: not valid base64") from None
        return open_image(data, where)
    except ImageInputError as e:
        raise APIError(400, " ".join(str(e).split()), param=where.split("[")[0],
                       code="invalid_image") from None


class FunctionCall(_Strict):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None        # assistant turns that called tools
    tool_call_id: str | None = None                   # role "tool": the call it answers
    # fields clients echo back from an earlier response (accepted, not used)
    refusal: str | None = None
    annotations: list | None = None
    function_call: dict | None = None
    audio: dict | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, TextPart))
        return self.content or ""

    def for_template(self, where: str = "messages") -> dict:
        """The message for the chat template; image parts become {"type": "image", "image":
        PIL image} beside {"type": "text"} parts (decoded here: a bad one is a 400)."""
        d: dict = {"role": self.role, "content": self.text()}
        if isinstance(self.content, list) and any(isinstance(p, ImagePart) for p in self.content):
            d["content"] = [{"type": "text", "text": p.text} if isinstance(p, TextPart) else
                            {"type": "image", "image": request_image(
                                p.image_url.url, f"{where}.content[{j}].image_url")}
                            for j, p in enumerate(self.content)]
        if self.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            d["name"] = self.name
        return d


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("'response_format' of type json_schema needs a 'json_schema' "
                             "object with the 'schema'")
        return self


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions (text content; tools, response_format, logprobs, n)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None                  # [] is no tools (LangChain sends it)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # chat-template variables (vLLM / llama.cpp): {"enable_thinking": false} switches Qwen3's off
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        if self.tools == []:
            self.tools = None
            if self.tool_choice == "auto":
                self.tool_choice = None
        choice = self.tool_choice
        names = {t.function.name for t in self.tools or []}
        if choice is not None and choice != "none" and not self.tools:
            raise ValueError("'tool_choice' is set but no 'tools' were given")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"'tool_choice' names the function {choice.function.name!r}, which "
                             f"is not among 'tools' ({', '.join(sorted(names))})")
        forced = choice == "required" or isinstance(choice, NamedToolChoice)
        if forced and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("'response_format' and a forced 'tool_choice' cannot be combined; "
                             "the output is the tool call")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def top_k_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    """POST /v1/completions (one prompt; `suffix`: fill-in-the-middle; no echo)."""

    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: Literal[False] = False
    suffix: str | None = None         # fill-in-the-middle, for models with FIM tokens
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def top_k_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request is supported")
            v = v[0]
        if not v:
            raise ValueError("'prompt' is an empty string; send the text to continue "
                             "(at least one character)")
        return v


def find_surrogate(data: Any) -> str | None:
    """The JSON path of the first string (key or value) holding an unpaired UTF-16 surrogate
    ("\\ud800" is valid JSON but not Unicode text: no tokenizer can encode it), else None.
    Iterative: a deeply nested body must not become a RecursionError."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(item, dict):
            for k, v in reversed(list(item.items())):
                name = str(k).encode("utf-8", "backslashreplace").decode()
                where = f"{path}.{name}" if path else name
                stack.append((v, where))
                stack.append((k, where))
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


# --- request parsing ------------------------------------------------------------------------------
FRIENDLY = {
    "input": "'input' must be a non-empty string, an array of strings, an array of token ids, "
             "or an array of token-id arrays",
    "messages": "'messages' must be a non-empty array of {role, content} objects "
                "(roles: system, developer, user, assistant; text content only)",
    "prompt": "'prompt' must be a string (or an array holding one string)",
}


async def parse(request: Request, model: type[BaseModel]) -> Any:
    body = await request.body()
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise APIError(400, f"We could not parse the JSON body of your request ({e}). Send a "
                            f"JSON object with Content-Type: application/json.") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.")
    where = find_surrogate(data)
    if where is not None:           # valid JSON ("\\ud800"), but no tokenizer can encode it
        param = where.split(".")[0].split("[")[0]
        raise APIError(400, f"'{where}' contains an unpaired UTF-16 surrogate (such as \\ud800), "
                            f"which is not valid Unicode text; send well-formed UTF-8 or pair the "
                            f"surrogates.", param=param, code="invalid_value")
    try:
        req = model.model_validate(data, strict=True)   # strict types: see check_limits below
    except ValidationError as e:
        unknown = [x["loc"] for x in e.errors() if x["type"] == "extra_forbidden"]
        if not unknown:
            raise validation_error(e) from None
        for loc in unknown:             # ignored, as llama.cpp's server does: warn, drop, retry
            _drop(data, loc)
        try:
            req = model.model_validate(data, strict=True)
        except ValidationError as e2:
            raise validation_error(e2) from None
    check_limits(req)
    return req


WARNED: set[str] = set()                 # unknown field names warned about (once each)


def _drop(data: Any, loc: tuple) -> None:
    """Remove the unknown field at `loc` from the request body (union-branch tags in the path,
    such as 'list[TextPart]', are skipped); warn once per field name."""
    *head, last = loc
    names = []
    for p in head:
        if isinstance(data, list) and isinstance(p, int) and p < len(data):
            data = data[p]
        elif isinstance(data, dict) and p in data:
            names.append(str(p))
            data = data[p]
    if not isinstance(data, dict) or last not in data:
        return
    data.pop(last)
    name = ".".join(names + [str(last)])
    if name not in WARNED:
        WARNED.add(name)
        log.warning("ignoring the unknown request field %r (warned once per field name)", name)


def validation_error(e: ValidationError) -> APIError:
    errs = e.errors()
    extra = [x for x in errs if x["type"] == "extra_forbidden"]
    if extra:
        name = ".".join(str(p) for p in extra[0]["loc"])
        return APIError(400, f"Unrecognized request argument supplied: {name}", param=name,
                        code="unknown_parameter")
    missing = [x for x in errs if x["type"] == "missing"]
    if missing:
        name = str(missing[0]["loc"][0])
        return APIError(400, f"Missing required parameter: '{name}'.", param=name,
                        code="missing_required_parameter")
    first = errs[0]
    name = str(first["loc"][0]) if first["loc"] else None
    msg = FRIENDLY.get(name or "") or f"Invalid value for '{name}': {first['msg']}"
    if first["type"] == "value_error" and (first["loc"] == ()
                                           or first["msg"].startswith("Value error, '")):
        msg = first["msg"].removeprefix("Value error, ")
    elif name == "seed":
        msg = (f"Invalid value for 'seed': {first.get('input')!r}; it must be an integer in "
               f"[-2**63, 2**64 - 1].")
    return APIError(400, msg, param=name, code="invalid_value")


# --- bounds on every per-request structure; strict types (issue #32) ------------------------------
# Parsing is strict (parse: model_validate(strict=True)): booleans are JSON booleans, integers JSON
# integers ("stream": "yes", "max_tokens": "8" and "n": 1.0 are 400s, as OpenAI answers them);
# floats accept integers. Every structure a request can grow is bounded; an over-limit one is a
# 400 naming the parameter and the limit, before the request takes a place on the NPU. n (MAX_N)
# and top_logprobs (20; 5 for /v1/completions) are bounded by their fields above.
MAX_TOOLS = 128                 # OpenAI's limit on tools per request
MAX_STOP_CHARS = 1024           # per stop string (the text stream holds back up to its length)
MAX_LOGIT_BIAS = 300            # logit_bias entries (each one is a per-token logits write)


def over_limit(param: str, what: str, limit: int, unit: str) -> APIError:
    return APIError(400, f"'{param}' {what}; this server accepts at most {limit} {unit}.",
                    param=param, code="invalid_value")


def check_limits(req: BaseModel) -> None:
    """Refuse a parsed request whose tools, stop strings or logit_bias pass their bounds, or
    whose tool parameter schemas do (checked_schema)."""
    tools = getattr(req, "tools", None) or []
    if len(tools) > MAX_TOOLS:
        raise over_limit("tools", f"has {len(tools)} entries", MAX_TOOLS, "tools")
    for i, tool in enumerate(tools):
        schema, where = tool_schema(tool)
        if schema is not None:
            checked_schema(schema, "tools", f"'tools[{i}].{where}'")
    stops = req.stop_list() if hasattr(req, "stop_list") else []
    for i, stop in enumerate(stops):
        if len(stop) > MAX_STOP_CHARS:
            raise over_limit("stop", f"[{i}] is {len(stop)} characters long", MAX_STOP_CHARS,
                             "characters per stop string")
    bias = getattr(req, "logit_bias", None) or {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise over_limit("logit_bias", f"has {len(bias)} entries", MAX_LOGIT_BIAS, "entries")


def tool_schema(tool: Any) -> tuple[Any, str]:
    """A tool's parameter schema and where it sits, in each API's shape: OpenAI chat
    (function.parameters), Responses (parameters), Anthropic (input_schema)."""
    fn = getattr(tool, "function", None)
    if fn is not None:
        return fn.parameters, "function.parameters"
    for field_name in ("parameters", "input_schema"):
        if hasattr(tool, field_name):
            return getattr(tool, field_name), field_name
    return None, ""


def checked_schema(schema: Any, param: str, where: str | None = None) -> Any:
    """A client's JSON schema, checked before any work: its size and depth bounds and that some
    finite value matches it (engine/llm/constrained.check_schema: no recursion, so a 250-deep or
    self-referencing schema is a 400, not a RecursionError), then that it is a valid JSON schema
    (jsonschema). A 400 naming `param` otherwise."""
    from torch_xdna.engine.llm.constrained import GrammarError, check_schema
    where = where or f"'{param}'"
    try:
        check_schema(schema, where)
    except GrammarError as e:
        raise APIError(400, f"{e}.", param=param, code="invalid_value") from None
    import jsonschema
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise APIError(400, f"{where} is not a valid JSON schema: {e.message}", param=param,
                       code="invalid_value") from None
    except RecursionError:
        raise APIError(400, f"{where} refers to itself too deeply to be checked; simplify its "
                            f"$refs.", param=param, code="invalid_value") from None
    return schema
