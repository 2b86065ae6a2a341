"""A fake Anthropic Messages API on 127.0.0.1, for tests that must not touch the network.

It speaks the wire format the real API speaks, so the real `anthropic` SDK can be
pointed at it with ANTHROPIC_BASE_URL:

- POST /v1/messages               JSON, or SSE when the body has "stream": true
- POST /v1/messages/count_tokens
- GET  /v1/models/{id}, GET /v1/models

Every request is validated the way the real API validates it (tool pairing, block
order, empty messages and text, tool schemas) and rejected with the real error texts. The context
window is enforced with the real "prompt is too long: N tokens > M maximum" error.

Replies are scripted. Requests that offer tools the model may call go to `replies`;
summary requests (no tools, or tool_choice "none") go to `summaries`. Each scripted
item is a reply dict (see `text`, `tool_use`, `error`) or a callable that receives
the request body and returns one.

Provider behaviours
-------------------
Anthropic-compatible endpoints (DeepSeek, Kimi, GLM, MiniMax, OpenRouter, LiteLLM,
vLLM, llama.cpp) differ from Anthropic in ways a client must survive. Each difference
is a constructor keyword, also settable as an attribute on a running server; the
defaults are Anthropic's behaviour. `PROVIDERS` bundles them per provider.

- overflow="anthropic"   how a prompt that does not fit the window is refused; one of
                         `OVERFLOWS` (status, body, and whether max_tokens counts).
                         Refusals are listed in `overflows`, invalid requests in
                         `invalid`, and both in `rejections`.
- models_api=True        False: GET /v1/models/{id} and GET /v1/models answer 404.
- models=None            the ids the Models API knows. None: a lookup by id answers for
                         any model (404 `model: <id>` unless max_input_tokens is set) and
                         there is no list. A list: ids in it answer, others get that 404,
                         and GET /v1/models lists them.
- models_list="anthropic"  "openai": the list is OpenAI-shaped (`"object": "list"`), as
                         vLLM, LiteLLM, OpenRouter and llama.cpp serve it, and there is no
                         lookup by id (404 Not found).
- count_tokens_api=True  False: POST /v1/messages/count_tokens answers 404.
- usage="anthropic"      how usage is reported: "no_delta_usage" (no usage in
                         message_delta), "zero_start" (zeros in message_start, the real
                         figures in message_delta), "includes_cache" (input_tokens
                         already includes cache reads), "none" (no usage anywhere).
                         `usage_log` always holds what the prompt really cost.
- auth="any"             "bearer": only `Authorization: Bearer <token>` is accepted.
                         `auth_headers` records what every request carried.
- thinking=False         True: replies start with a signed thinking block (unless the
                         script starts one itself, or the reply has "think": False),
                         and a tool loop must pass the last one back unchanged.
- tool_ids="anthropic"   "kimi": generated ids are `functions.{name}:{k}`.
- system_format="any"    "string": a system prompt sent as a list of blocks is refused
                         with LiteLLM's 500 quoting llama-cpp-python's pydantic errors.
- tool_stream="whole"    "pieces": each tool call streams as one tool_use block per
                         piece of its JSON, all with the call's id, then an empty one,
                         as LiteLLM relays llama.cpp's chunks.
- template="any"         "strings": the chat template behind the proxy concatenates strings
                         (SmolLM2's, as llama.cpp renders it): a message whose text comes
                         as a list of blocks, text beside tool results, or a call with no
                         text beside it fails inside the server, as a silent failure.
- auth="litellm"         a key other than `token` is refused as LiteLLM without a
                         database refuses it: 400 no_db_connection, "No connected db.".

LiteLLM relaying llama.cpp (`PROVIDERS["litellm_llamacpp"]`) also answers a prompt over
the server's context size, streamed, with a 200 that holds nothing: message_start with
zero usage, an empty text block, end_turn with zero usage (`silent_failure()` scripts
the same for any other failure on the server, a template error after a tool call).

Scripted misbehaviour: `malformed("sse_not_json" | "json_body" | "empty_body")`,
`error_event`, `hang` and `pings_only` answer the same bytes whether or not the request
asked to stream; `broken_tool_json` streams tool input that does not parse, and tool
inputs that are not objects (`tool_use("bash", ["ls"])`) are streamed as they are.
`held(reply, gate, seconds)` sends a reply only once a test sets `gate` (or the time passes):
a slow summary, released when the test chooses. `stalls` records how each hang, held or
ping-only reply ended: "client closed", "timed out"
or "server closed". `split_surrogates(reply)` streams each emoji as two UTF-16 halves in
two deltas.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import math
import re
import select
import socket
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
MAX_CACHE_BREAKPOINTS = 4
CACHE_LOOKBACK_BLOCKS = 20   # the API looks this many blocks back from a breakpoint for a hit
MIN_CACHEABLE_TOKENS = 1024  # shorter prefixes are not cached...
# ...except on these model families (prompt caching docs, "Cache limitations"): first match wins
MIN_CACHEABLE_BY_MODEL = [(r"opus-4-5|haiku-4-5", 4096), (r"haiku-3|3-haiku|3-5-haiku", 2048)]
CACHE_TTL_SECONDS = {"5m": 300, "1h": 3600}  # a read refreshes the entry for another TTL
PING_INTERVAL = 0.2          # seconds between the pings of a `pings_only` reply
POLL_INTERVAL = 0.02         # how often a stalled reply looks for a hang-up or a shutdown


# ---------------------------------------------------------------- reply builders

def text(body: str, **extra) -> dict:
    """A reply whose content is one text block."""
    return {"content": [{"type": "text", "text": body}], **extra}


def tool_use(name: str, input: Any, id: str | None = None, preface: str | None = None) -> dict:
    """A reply that calls one tool (optionally after a sentence of text).

    `input` is normally a dict; a string or a list is sent as it is, since models
    behind some endpoints produce such inputs and the client must cope."""
    return tool_uses([(name, input, id)], preface=preface)


def tool_uses(calls, preface: str | None = None) -> dict:
    """A reply with several tool calls in one assistant message (parallel tool use)."""
    content = [{"type": "text", "text": preface}] if preface else []
    for call in calls:
        name, args = call[0], call[1]
        call_id = call[2] if len(call) > 2 else None
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
    return {"content": content}


def error(status: int, kind: str, message: str, **extra) -> dict:
    """A reply that is an HTTP error with the API's error envelope."""
    return {"error": {"status": status, "type": kind, "message": message}, **extra}


def split_surrogates(reply: dict) -> dict:
    """The same reply, streamed with each emoji (any character beyond the BMP) cut into its
    two UTF-16 halves across two deltas: JSON `\\ud83d` ends one text_delta, thinking_delta or
    input_json_delta and `\\ude00` starts the next, as endpoints that cut a stream by UTF-16
    units send it. The client must join them; each half alone cannot be encoded."""
    return dict(reply, split_surrogates=True)


def utf16_pieces(text: str) -> list:
    """text as UTF-16 halves, cut after every first half (the pieces rejoined are the text)."""
    pieces, piece = [], ""
    for char in text:
        if ord(char) <= 0xFFFF:
            piece += char
            continue
        high, low = divmod(ord(char) - 0x10000, 0x400)
        pieces.append(piece + chr(0xD800 + high))
        piece = chr(0xDC00 + low)
    return pieces + [piece] if piece or not pieces else pieces


def overloaded() -> dict:
    return error(529, "overloaded_error", "Overloaded")


def server_error() -> dict:
    return error(500, "api_error", "Internal server error")


class RawJSON(str):
    """Tool input text streamed verbatim as partial_json, even when it is not valid JSON."""


def broken_tool_json(name: str, partial: str = '{"path": "a.py", ', id: str | None = None) -> dict:
    """A tool call whose streamed input_json_delta pieces add up to invalid JSON.

    A JSON (non-streamed) reply carries the broken text as a string `input`."""
    return {"content": [{"type": "tool_use", "id": id, "name": name, "input": RawJSON(partial)}],
            "stop_reason": "tool_use"}


MALFORMED = ("sse_not_json", "json_body", "empty_body", "bad_utf8")


def malformed(kind: str, reply: dict | None = None) -> dict:
    """A reply broken on the wire. These are sent as they are, streamed request or not:

    - "sse_not_json": 200 SSE whose second event's data line is not JSON, then close;
    - "json_body": the whole message as a JSON body although the request asked to
      stream (`reply` is its content; the default reply when None);
    - "empty_body": 200 text/event-stream with content-length 0;
    - "bad_utf8": a text reply whose delta holds a byte that is not UTF-8.
    """
    if kind not in MALFORMED:
        raise ValueError(f"malformed kind must be one of {MALFORMED}, not {kind!r}")
    return {"malformed": kind, "reply": reply}


def error_event(kind: str = "overloaded_error", message: str = "Overloaded") -> dict:
    """A 200 stream that sends message_start, then an `error` event, then closes.

    Overflow texts can arrive this way too, e.g.
    error_event("invalid_request_error", "prompt is too long: 300 tokens > 200 maximum")."""
    return {"error_event": {"type": kind, "message": message}}


def silent_failure() -> dict:
    """What LiteLLM streams when the server behind it failed: a 200 with no content and no
    usage, ending in end_turn (see `_send_silent_failure`)."""
    return {"silent_failure": True}


def hang(seconds: float | None = None) -> dict:
    """Read the request and send nothing at all, not even a status line, until the
    client hangs up or `seconds` pass (None: until the server shuts down)."""
    return {"hang": seconds}


def held(reply: dict, gate: threading.Event | None = None, seconds: float | None = None) -> dict:
    """`reply`, sent only once `gate` is set or `seconds` have passed: a slow model, or one a
    test releases when it chooses. A client that hangs up first is recorded in `stalls`
    ("client closed"), and gets nothing."""
    return {"held": reply, "gate": gate, "seconds": seconds}


def drip(seconds_per_byte: float) -> dict:
    """A 200 stream of message_start, then a text block's start sent one byte at a time,
    `seconds_per_byte` apart, until the client hangs up (or the event is whole): a reply
    that never stops but never gets anywhere."""
    return {"drip": seconds_per_byte}


def pings_only(seconds: float, style: str = "event") -> dict:
    """A 200 stream of message_start followed only by keep-alives, every PING_INTERVAL
    seconds for `seconds`, then the connection closes. They defeat a read timeout.
    style: "event" (`event: ping`), "data" (a ping with no event line), or "comment"
    (an SSE comment line, as OpenRouter sends while a model is thinking)."""
    return {"pings_only": seconds, "ping_style": style}


# ---------------------------------------------------------------- provider behaviours

@dataclass(frozen=True)
class Overflow:
    """How an endpoint refuses a prompt that does not fit its context window.

    `message` is a template over n (the prompt's tokens), m (the request's
    max_tokens), t (n + m) and w (the window)."""
    status: int
    kind: str | None               # error.type; None where the body has none
    message: str
    counts_max_tokens: bool        # True: refused when n + m > w, else when n > w
    body: str = "anthropic"        # "anthropic" envelope | "raw" (below) | "empty" | "stop_reason"
    raw: dict | None = None        # the whole body, for endpoints that answer OpenAI-style

    def text(self, n: int, m: int, w: int) -> str:
        return self.message.format(n=n, m=m, t=n + m, w=w)


OVERFLOWS = {
    "anthropic": Overflow(400, "invalid_request_error", "prompt is too long: {n} tokens > {w} maximum", False),
    # older Anthropic models weigh the prompt together with the output it may need
    "anthropic_max_tokens": Overflow(
        400, "invalid_request_error",
        "input length and `max_tokens` exceed context limit: {n} + {m} > {w}, "
        "decrease input length or `max_tokens` and try again", True),
    # Cloudflare in front of the API refuses an oversized body before the API sees it
    "413": Overflow(413, "request_too_large", "Request exceeds the maximum allowed number of bytes.", False),
    "413_empty": Overflow(413, None, "", False, body="empty"),
    # DeepSeek and OpenRouter pass on OpenAI's wording
    "openai": Overflow(
        400, "invalid_request_error",
        "This model's maximum context length is {w} tokens. However, you requested {t} tokens "
        "({n} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
        True),
    "vllm": Overflow(400, "invalid_request_error",
                     "The input ({n} tokens) is longer than the model's context length ({w} tokens).", False),
    "llamacpp": Overflow(400, "exceed_context_size_error",
                         "the request exceeds the available context size, try increasing it", True),
    "kimi": Overflow(400, "invalid_request_error",
                     "Invalid request: Your request exceeded model token limit: {w} (requested: {t})", True),
    # MiniMax's code 2013 is reused for other invalid parameters, so the text alone is ambiguous
    "minimax": Overflow(400, "invalid_request_error", "invalid params, context window exceeds limit (2013)", True),
    # GLM's OpenAI-style side: a bare error object, no "type": "error" envelope
    "glm": Overflow(400, None, "Prompt exceeds max length", False, body="raw",
                    raw={"error": {"code": "1261", "message": "Prompt exceeds max length"}}),
    "glm_short": Overflow(400, "invalid_request_error", "prompt too long", False),
    # the code, not the text, is what OpenAI-style clients (Codex) match on
    "context_length_exceeded": Overflow(
        400, "invalid_request_error", "Input is too long for the model.", False, body="raw",
        raw={"error": {"type": "invalid_request_error", "code": "context_length_exceeded",
                       "message": "Input is too long for the model."}}),
    "litellm": Overflow(
        400, None,
        "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: "
        "prompt too long for model", False, body="raw",
        raw={"error": {"message": "litellm.ContextWindowExceededError: litellm.BadRequestError: "
                                  "ContextWindowExceededError: prompt too long for model",
                       "type": None, "param": None, "code": "400"}}),
    # LiteLLM relaying llama-cpp-python: streamed, the failure inside the server becomes an
    # empty 200 (body "silent"); not streamed, llama-cpp-python's words come through, wrapped
    "litellm_llamacpp": Overflow(
        400, "invalid_request_error",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: OpenAIException - "
        "This model's maximum context length is {w} tokens. However, you requested {t} tokens ({n} in the messages, "
        "{m} in the completion). Please reduce the length of the messages or completion.\nmodel=smollm. "
        "context_window_fallbacks=None. fallbacks=None.\n\nSet 'context_window_fallback' - "
        "https://docs.litellm.ai/docs/routing#fallbacks\n\nLiteLLM: model group 'smollm' failed with the error "
        "above. No fallback was attempted.", False, body="silent"),
    # LiteLLM with model_info.max_input_tokens and enable_pre_call_checks refuses before the call
    "litellm_precall": Overflow(
        400, "invalid_request_error",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: litellm._pre_call_checks: Context Window "
        "exceeded for given call. No models have context window large enough for this call.\nModel=openai/smollm, "
        "Max Input Tokens={w}, Got={n}\nmodel=smollm. context_window_fallbacks=None. fallbacks=None.\n\nSet "
        "'context_window_fallback' - https://docs.litellm.ai/docs/routing#fallbacks\n\nLiteLLM: model group "
        "'smollm' failed with the error above. No fallback was attempted.", False),
    # GLM and Claude 4.5+: not an error at all, a 200 reply that stops at once
    "stop_reason": Overflow(200, None, "model_context_window_exceeded", True, body="stop_reason"),
}

USAGE_STYLES = ("anthropic", "no_delta_usage", "zero_start", "includes_cache", "none")
AUTH_STYLES = ("any", "bearer", "litellm")
TOOL_ID_STYLES = ("anthropic", "kimi")
SYSTEM_FORMATS = ("any", "string")
TEMPLATES = ("any", "strings")
TOOL_STREAMS = ("whole", "pieces")
MODELS_LIST_STYLES = ("anthropic", "openai")

# Each row models facts gathered in /work/shared/endpoints.md.
PROVIDERS = {
    "anthropic": {},
    # DeepSeek: OpenAI's overflow text, counting max_tokens; no Models API and no
    # count_tokens; thinking blocks must be passed back in a tool loop.
    "deepseek": dict(overflow="openai", models_api=False, count_tokens_api=False, thinking=True),
    # Kimi: "exceeded model token limit: W (requested: T)"; no Models API or count_tokens;
    # input_tokens already include cache reads; tool ids look like functions.Bash:0.
    "kimi": dict(overflow="kimi", models_api=False, count_tokens_api=False, usage="includes_cache",
                 tool_ids="kimi"),
    # GLM (z.ai): a 200 with stop_reason model_context_window_exceeded; no Models API or
    # count_tokens; message_start reports input_tokens 0, the figures come in message_delta.
    "glm": dict(overflow="stop_reason", models_api=False, count_tokens_api=False, usage="zero_start"),
    # MiniMax: "context window exceeds limit (2013)", counting max_tokens; no Models API or
    # count_tokens; message_delta may come without usage.
    "minimax": dict(overflow="minimax", models_api=False, count_tokens_api=False, usage="no_delta_usage"),
    # OpenRouter: OpenAI's overflow text; configured with ANTHROPIC_AUTH_TOKEN (a bearer
    # token); no Models API at this path.
    "openrouter": dict(overflow="openai", auth="bearer", models_api=False),
    # LiteLLM proxy: an OpenAI-shaped ContextWindowExceededError body (it does count tokens).
    "litellm": dict(overflow="litellm"),
    # vLLM: "The input (N tokens) is longer than the model's context length (W tokens)."
    "vllm": dict(overflow="vllm", models_api=False, count_tokens_api=False),
    # llama.cpp: "exceeds the available context size"; reports no usage.
    "llamacpp": dict(overflow="llamacpp", models_api=False, count_tokens_api=False, usage="none"),
    # LiteLLM (use_chat_completions_url_for_anthropic_messages) relaying llama-cpp-python: a
    # string-only system prompt, tool calls in pieces, an overflow as an empty 200, the real
    # usage only in message_delta, no count_tokens, its master key only.
    "litellm_llamacpp": dict(overflow="litellm_llamacpp", system_format="string", tool_stream="pieces",
                             usage="zero_start", count_tokens_api=False, auth="litellm", template="strings"),
}

THINKING_KEY = b"fake-anthropic-thinking"  # fixed, so a signature stays valid across fake servers


def sign_thinking(thinking: str) -> str:
    """The signature the fake gives a thinking text; any change to the text breaks it."""
    digest = hmac.new(THINKING_KEY, thinking.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def reported_usage(style: str, usage: dict) -> dict | None:
    """The usage a reply shows under a usage style (`usage_log` keeps the true figures)."""
    if style == "none":
        return None
    if style == "includes_cache":  # Kimi: cache reads are inside input_tokens, not beside them
        return dict(usage, input_tokens=usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0))
    return dict(usage)


def streamed_usage(style: str, usage: dict) -> tuple[dict | None, dict | None]:
    """The usage of message_start and of message_delta under a usage style.

    None means `"usage": null` in message_start, and no usage key in message_delta."""
    shown = reported_usage(style, usage)
    if shown is None:
        return None, None
    if style == "zero_start":  # GLM: zeros first, every real figure only at the end
        zeros = dict(shown, input_tokens=0, cache_read_input_tokens=0, cache_creation_input_tokens=0,
                     output_tokens=0)
        final = {key: shown.get(key, 0) for key in ("input_tokens", "cache_read_input_tokens",
                                                    "cache_creation_input_tokens", "output_tokens")}
        return zeros, final
    start = dict(shown, output_tokens=1)
    if style == "no_delta_usage":  # MiniMax
        return start, None
    return start, {"output_tokens": shown["output_tokens"]}


# ---------------------------------------------------------------- validation

class InvalidRequest(Exception):
    """A request the real API would answer with 400 invalid_request_error."""


SUMMARY_OPENING = "TEXT ONLY, NO TOOLS."  # how code.py's summary instruction begins


def is_summary_request(body: dict) -> bool:
    """A request for a summary, to be answered from `summaries`: it has no tools, forbids
    them, or ends with the summary instruction (a request that keeps the tools as they
    were, so that it reads the conversation's cache)."""
    choice = body.get("tool_choice") or {}
    last = (body.get("messages") or [{}])[-1]
    content = last.get("content") if isinstance(last, dict) else None
    ending = content[-1].get("text", "") if isinstance(content, list) and content and isinstance(content[-1], dict) \
        else content if isinstance(content, str) else ""
    if isinstance(content, list) and content and isinstance(content[-1], dict) and \
            content[-1].get("type") == "tool_result":  # plain text: what followed the results is inside the last
        ending = content[-1].get("content") if isinstance(content[-1].get("content"), str) else ""
    ending = str(ending)
    return not body.get("tools") or choice.get("type") == "none" or ending.startswith(SUMMARY_OPENING) or \
        f"\n\n{SUMMARY_OPENING}" in ending  # plain text: the instruction is the last paragraph of a string


def _check_text_block(block: dict, where: str) -> None:
    value = block.get("text")
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}.text: Field required")
    if value == "":
        raise InvalidRequest(f"{where.split('.')[0]}: text content blocks must be non-empty")
    if not value.strip():
        raise InvalidRequest(f"{where.split('.')[0]}: text content blocks must contain non-whitespace text")


def _check_tool_result_content(content, where: str) -> None:
    if isinstance(content, str) or content is None:
        return
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: Input should be a valid string or list")
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
            raise InvalidRequest(f"{where}.content.{k}: Input tag does not match any of the expected tags: 'text', 'image'")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}.content.{k}.text: Field required")


def _check_block(block, role: str, where: str) -> None:
    if not isinstance(block, dict) or "type" not in block:
        raise InvalidRequest(f"{where}: Input should be a valid dictionary with a 'type' field")
    kind = block["type"]
    if kind == "text":
        _check_text_block(block, where)
    elif kind == "tool_use":
        if role != "assistant":
            raise InvalidRequest(f"{where}: `tool_use` blocks can only be in `assistant` messages")
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            raise InvalidRequest(f"{where}: tool_use blocks require string `id` and `name`")
        if not isinstance(block.get("input"), dict):
            raise InvalidRequest(f"{where}.input: Input should be a valid dictionary")
    elif kind == "tool_result":
        if role != "user":
            raise InvalidRequest(f"{where}: `tool_result` blocks can only be in `user` messages")
        if not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequest(f"{where}.tool_use_id: Field required")
        _check_tool_result_content(block.get("content"), where)
    elif kind in ("image", "document", "thinking", "redacted_thinking"):
        pass
    else:
        raise InvalidRequest(f"{where}.type: Input tag '{kind}' found using 'type' does not match any of the expected tags")
    extra = set(block) - {"type", "text", "id", "name", "input", "tool_use_id", "content",
                          "is_error", "cache_control", "source", "thinking", "signature",
                          "data", "citations", "title", "context"}
    if extra:
        raise InvalidRequest(f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted")


def _blocks(message: dict) -> list:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content


def _merge_consecutive(messages: list) -> list:
    """The real API folds consecutive same-role messages into one turn."""
    merged = []
    for index, message in enumerate(messages):
        blocks = [(index, k, b) for k, b in enumerate(_blocks(message))]
        if merged and merged[-1][0] == message["role"]:
            merged[-1][1].extend(blocks)
        else:
            merged.append((message["role"], blocks, index))
    return merged


def _check_pairing(messages: list) -> None:
    turns = _merge_consecutive(messages)
    seen_ids: set = set()
    for t, (role, blocks, first_index) in enumerate(turns):
        if role == "user":
            previous = turns[t - 1][1] if t > 0 else []
            offered = {b["id"] for _, _, b in previous if b.get("type") == "tool_use"}
            for i, k, b in blocks:
                if b.get("type") == "tool_result" and b["tool_use_id"] not in offered:
                    raise InvalidRequest(
                        f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{b['tool_use_id']}. Each `tool_result` block must have a corresponding `tool_use` "
                        f"block in the previous message.")
            continue
        uses = [b for _, _, b in blocks if b.get("type") == "tool_use"]
        for i, k, b in blocks:
            if b.get("type") == "tool_use":
                if b["id"] in seen_ids:
                    raise InvalidRequest(f"messages.{i}.content.{k}: `tool_use` ids must be unique")
                seen_ids.add(b["id"])
        if not uses:
            continue
        last_index = blocks[-1][0] if blocks else first_index
        if t + 1 >= len(turns):
            raise InvalidRequest(
                f"messages.{last_index}: `tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {', '.join(b['id'] for b in uses)}. Each `tool_use` block must have a corresponding "
                f"`tool_result` block in the next message.")
        following = turns[t + 1][1]
        leading = []
        for _, _, b in following:
            if b.get("type") != "tool_result":
                break
            leading.append(b["tool_use_id"])
        missing = [b["id"] for b in uses if b["id"] not in leading]
        if missing:
            raise InvalidRequest(
                f"messages.{last_index}: `tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` "
                f"block in the next message.")
        if len(leading) < len([b for _, _, b in following if b.get("type") == "tool_result"]):
            raise InvalidRequest(
                f"messages.{turns[t + 1][2]}: Did not find {len(uses)} `tool_result` block(s) at the beginning "
                f"of this message. Messages following `tool_use` blocks must begin with a matching number of "
                f"`tool_result` blocks.")


def _count_cache_breakpoints(body: dict) -> int:
    found = 0
    for part in [body.get("system")] + (body.get("tools") or []) + (body.get("messages") or []):
        if isinstance(part, dict):
            found += "cache_control" in part
            for block in part.get("content") if isinstance(part.get("content"), list) else []:
                found += isinstance(block, dict) and "cache_control" in block
        elif isinstance(part, list):
            found += sum(1 for b in part if isinstance(b, dict) and "cache_control" in b)
    return found


def validate_request(body: dict, *, need_max_tokens: bool = True) -> None:
    """Raise InvalidRequest with the real API's message for the first problem found."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("model: Field required")
    if need_max_tokens:
        if "max_tokens" not in body:
            raise InvalidRequest("max_tokens: Field required")
        if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
            raise InvalidRequest("max_tokens: Input should be greater than or equal to 1")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: Field required")
    if not messages:
        raise InvalidRequest("messages: at least one message is required")
    system = body.get("system")
    if isinstance(system, list):
        for k, block in enumerate(system):
            _check_text_block(block, f"system.{k}")
    elif system is not None and not isinstance(system, str):
        raise InvalidRequest("system: Input should be a valid string or list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise InvalidRequest(f"messages.{i}.content: Input should be a valid string or list")
        final_assistant = i == len(messages) - 1 and message["role"] == "assistant"  # a prefill may be empty
        if not content and not final_assistant:
            raise InvalidRequest(f"messages.{i}: all messages must have non-empty content except for the "
                                 "optional final assistant message")
        if isinstance(content, str):
            if message["role"] == "user" and not content.strip():
                raise InvalidRequest("messages: text content blocks must contain non-whitespace text")
            continue
        for k, block in enumerate(content):
            _check_block(block, message["role"], f"messages.{i}.content.{k}")
    if messages[0]["role"] != "user":
        raise InvalidRequest('messages: first message must use the "user" role')
    _check_pairing(messages)
    names = []
    for k, tool in enumerate(body.get("tools") or []):
        if not TOOL_NAME_RE.match(str(tool.get("name", ""))):
            raise InvalidRequest(f"tools.{k}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise InvalidRequest(f"tools.{k}.input_schema.type: Input should be 'object'")
        names.append(tool["name"])
    if len(names) != len(set(names)):
        raise InvalidRequest("tools: Tool names must be unique.")
    breakpoints = _count_cache_breakpoints(body)
    if breakpoints > MAX_CACHE_BREAKPOINTS:
        raise InvalidRequest(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {breakpoints}.")


def renders_as_strings(messages: list) -> bool:
    """Whether a chat template that concatenates strings can take these messages once
    LiteLLM has made them OpenAI messages: text only as a string, no text beside tool
    results (it would become a user message of parts), no call without text."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            continue
        kinds = [b.get("type") for b in content if isinstance(b, dict)]
        if "text" in kinds and ("tool_result" in kinds or set(kinds) == {"text"}):
            return False
        if message.get("role") == "assistant" and "tool_use" in kinds and "text" not in kinds:
            return False
    return True


def check_thinking_passback(messages: list) -> None:
    """With thinking on, a tool loop must hand back the thinking that led to its tool calls.

    When the messages end with a user turn of tool results, the assistant turn before
    it must start with the thinking block it was given, text and signature unchanged
    (or with a redacted_thinking block), as Anthropic and DeepSeek require."""
    turns = _merge_consecutive(messages)
    if len(turns) < 2 or turns[-1][0] != "user" or turns[-2][0] != "assistant":
        return
    if not any(b.get("type") == "tool_result" for _, _, b in turns[-1][1]):
        return
    if not turns[-2][1]:
        return  # an empty assistant turn; the pairing check has already refused its results
    i, k, first = turns[-2][1][0]
    kind = first.get("type")
    if kind == "redacted_thinking":
        return
    if kind != "thinking":
        raise InvalidRequest(
            f"messages.{i}.content.{k}.type: Expected `thinking` or `redacted_thinking`, but found `{kind}`. "
            f"When `thinking` is enabled, a final `assistant` message must start with a thinking block "
            f"(preceeding the lastmost set of `tool_use` and `tool_result` blocks).")
    if not isinstance(first.get("thinking"), str) or first.get("signature") != sign_thinking(first["thinking"]):
        raise InvalidRequest(f"messages.{i}.content.{k}: Invalid `signature` in `thinking` block")


# ---------------------------------------------------------------- token counting

def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in ("type", "cache_control", "id", "tool_use_id"):
                yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _piece_tokens(value, chars_per_token: float) -> int:
    total = 0
    for piece in _strings(value):
        ascii_chars = len(piece.encode("ascii", "ignore"))
        total += math.ceil(ascii_chars / chars_per_token) + (len(piece) - ascii_chars)
    return total


def prompt_blocks(body: dict, chars_per_token: float = 3.5) -> list:
    """The prompt in cache order (tools, system, messages) as (key, tokens, is_breakpoint)."""
    out = []
    for tool in body.get("tools") or []:
        out.append(("tool", tool))
    system = body.get("system")
    for block in ([{"type": "text", "text": system}] if isinstance(system, str) else system or []):
        out.append(("system", block))
    for message in body.get("messages") or []:
        for k, block in enumerate(_blocks(message)):
            out.append((message["role"] if k == 0 else "", block))
    blocks = []
    for n, (where, block) in enumerate(out):
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        tokens = _piece_tokens(plain, chars_per_token) + (3 if n == 0 else 0) + (4 if where in ("user", "assistant") else 0)
        key = where + json.dumps(plain, sort_keys=True)
        marked = block.get("cache_control")
        blocks.append((key, tokens, (marked.get("ttl") or "5m") if isinstance(marked, dict) else None))
    return blocks


def count_tokens(body: dict, chars_per_token: float = 3.5) -> int:
    """A deterministic stand-in for the tokenizer.

    ASCII text costs 1/chars_per_token tokens a character; any other character costs
    one token (close to the real tokenizer for Chinese, Japanese and Korean).
    """
    return sum(tokens for _, tokens, _ in prompt_blocks(body, chars_per_token))


def message_settings(body: dict) -> str:
    """What the cached message blocks depend on besides their text (prompt caching docs,
    "What invalidates the cache"): tool_choice, the thinking settings, and whether any
    image is present. A change to any of them invalidates the messages part of the cache,
    while tools and system stay cached."""
    images = '"type": "image"' in json.dumps(body.get("messages") or [])
    return json.dumps([body.get("tool_choice"), body.get("thinking"), images], sort_keys=True)


def minimum_cacheable(model: str, default: int = MIN_CACHEABLE_TOKENS) -> int:
    return next((tokens for pattern, tokens in MIN_CACHEABLE_BY_MODEL if re.search(pattern, model or "")), default)


class PromptCache:
    """The API's prefix cache: a prefix up to a breakpoint is written; a later request
    reads the longest cached prefix found at, or up to 20 blocks before, its breakpoints.
    Entries live 5 minutes (or 1 hour with ttl "1h") on `clock`, each read renewing them."""

    def __init__(self, min_tokens: int = MIN_CACHEABLE_TOKENS, clock=time.monotonic):
        self.min_tokens, self.clock = min_tokens, clock
        self.prefixes: dict = {}  # prefix hash -> (expires at, ttl in seconds)
        self.lock = threading.Lock()

    def use(self, blocks: list, settings: str = "", min_tokens: int | None = None) -> dict:
        hashes, cumulative, digest, total = [], [], hashlib.sha256(), 0
        for key, tokens, _ in blocks:
            if key.startswith("user") and settings:  # the first message block: settings come before it
                digest.update(settings.encode())
                settings = ""
            digest.update(key.encode("utf-8", "surrogatepass"))
            hashes.append(digest.copy().hexdigest())
            total += tokens
            cumulative.append(total)
        breakpoints = [(i, ttl) for i, (_, _, ttl) in enumerate(blocks) if ttl]
        now, minimum = self.clock(), self.min_tokens if min_tokens is None else min_tokens
        with self.lock:
            self.prefixes = {h: entry for h, entry in self.prefixes.items() if entry[0] > now}
            read = 0
            for b, _ in breakpoints:
                for p in range(b, max(b - CACHE_LOOKBACK_BLOCKS, -1), -1):
                    if hashes[p] in self.prefixes:
                        read = max(read, cumulative[p])
                        ttl = self.prefixes[hashes[p]][1]
                        self.prefixes[hashes[p]] = (now + ttl, ttl)
                        break
            written = {"5m": 0, "1h": 0}
            for b, ttl in breakpoints:
                if cumulative[b] >= minimum and cumulative[b] > read:
                    seconds = CACHE_TTL_SECONDS[ttl]
                    if hashes[b] not in self.prefixes or self.prefixes[hashes[b]][1] < seconds:
                        self.prefixes[hashes[b]] = (now + seconds, seconds)
                    written[ttl] = max(written[ttl], cumulative[b])
        long_written = max(0, written["1h"] - read)
        short_written = max(0, written["5m"] - max(read, written["1h"]))
        return {"input_tokens": total - read - long_written - short_written, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": long_written + short_written,
                "cache_creation": {"ephemeral_5m_input_tokens": short_written, "ephemeral_1h_input_tokens": long_written}}


# ---------------------------------------------------------------- the server

# attributes whose value must be one of a fixed set of names
CHOICES = {"overflow": tuple(OVERFLOWS), "usage": USAGE_STYLES, "auth": AUTH_STYLES, "tool_ids": TOOL_ID_STYLES,
           "system_format": SYSTEM_FORMATS, "tool_stream": TOOL_STREAMS, "template": TEMPLATES,
           "models_list": MODELS_LIST_STYLES}


class FakeAnthropic:
    """A scripted Messages API. Use as a context manager; `url` goes into base_url."""

    def __init__(self, *, context_window: int = 200_000, max_input_tokens: int | None = None,
                 max_output_tokens: int = 64_000, chars_per_token: float = 3.5, min_cache_tokens: int | None = None,
                 overflow: str = "anthropic", models_api: bool = True, count_tokens_api: bool = True,
                 usage: str = "anthropic", auth: str = "any", token: str = "test", thinking: bool = False,
                 tool_ids: str = "anthropic", models: list | None = None, models_list: str = "anthropic",
                 system_format: str = "any", tool_stream: str = "whole", template: str = "any",
                 clock=time.monotonic):
        self.context_window, self.max_input_tokens = context_window, max_input_tokens
        self.max_output_tokens, self.chars_per_token = max_output_tokens, chars_per_token
        # provider behaviours (see the module docstring); tests may change them at any time
        self.overflow, self.models_api, self.count_tokens_api = overflow, models_api, count_tokens_api
        self.usage, self.auth, self.token, self.thinking, self.tool_ids = usage, auth, token, thinking, tool_ids
        self.models, self.models_list = models, models_list
        self.system_format, self.tool_stream, self.template = system_format, tool_stream, template
        self.template_failures = 0           # requests the "strings" template could not render
        self.replies: deque = deque()
        self.summaries: deque = deque()
        self.min_cache_tokens = min_cache_tokens  # None: by the model's family, as the API does
        self.cache = PromptCache(min_cache_tokens or MIN_CACHEABLE_TOKENS, clock)  # clock: the benchmark's own
        self.usage_log: list[dict] = []      # the usage of every answered request, summary or not
        self.requests: list[dict] = []       # every POST /v1/messages body, in order, valid or not
        self.bodies: list[bytes] = []        # every POST body exactly as it arrived (JSON text, not parsed)
        self.rejections: list[str] = []      # messages of every refusal below, in order
        self.invalid: list[str] = []         # messages of the 400s for invalid requests
        self.overflows: list[str] = []       # messages of the refusals for a prompt too big for the window
        self.auth_headers: list[dict] = []   # {"x-api-key": ..., "authorization": ...} of every request
        self.stalls: list[str] = []          # how each hang or pings_only reply ended
        self.count_token_calls = 0
        self.count_requests: list[dict] = []  # every count_tokens body, as received
        self.model_lookups: list[str] = []   # GET /v1/models/{id}
        self.model_lists = 0                 # GET /v1/models
        self.request_times: list[float] = []  # time.monotonic() of every POST /v1/messages
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._closing = threading.Event()    # set on exit, so stalled replies stop at once
        self.received = threading.Event()    # set on every /v1/messages request
        self.default_reply = text("Done.")   # answers when the script has run out
        self.default_summary = text("<summary>Fake summary of the conversation.</summary>")

    def __setattr__(self, name: str, value) -> None:
        # a misspelt style would otherwise surface as a dropped connection mid-test
        if name in CHOICES and value not in CHOICES[name]:
            raise ValueError(f"{name} must be one of {CHOICES[name]}, not {value!r}")
        super().__setattr__(name, value)

    # scripting -------------------------------------------------------------
    def reply(self, *items) -> "FakeAnthropic":
        self.replies.extend(items)
        return self

    def summary(self, *items) -> "FakeAnthropic":
        self.summaries.extend(items)
        return self

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def valid_requests(self) -> list[dict]:
        return [r for r in self.requests if r.get("_valid")]

    @property
    def main_requests(self) -> list[dict]:
        return [r for r in self.valid_requests if not is_summary_request(r)]

    @property
    def summary_requests(self) -> list[dict]:
        return [r for r in self.valid_requests if is_summary_request(r)]

    # lifecycle ---------------------------------------------------------------
    def __enter__(self) -> "FakeAnthropic":
        fake = self

        class Handler(_Handler):
            owner = fake

        self._closing.clear()
        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    # answering ---------------------------------------------------------------
    def next_reply(self, body: dict) -> dict:
        with self._lock:
            queue = self.summaries if is_summary_request(body) else self.replies
            item = queue.popleft() if queue else None
        if item is None:
            item = self.default_summary if is_summary_request(body) else self.default_reply
        if callable(item):
            item = item(body)
        return item

    def build_message(self, body: dict, reply: dict, think: bool = True, blocks: list | None = None) -> dict:
        """The whole message for a scripted reply, with ids, signatures and the true usage."""
        content, calls = [], 0
        for block in reply["content"]:
            block = dict(block)
            if block["type"] == "tool_use":
                if not block.get("id"):
                    block["id"] = self._tool_id(block["name"], calls)
                calls += 1
            if block["type"] == "thinking" and "signature" not in block:
                block["signature"] = sign_thinking(block["thinking"])
            content.append(block)
        if think and self.thinking and not (content and content[0]["type"] in ("thinking", "redacted_thinking")):
            thought = f"Working out reply {next(self._ids)} before answering."
            content.insert(0, {"type": "thinking", "thinking": thought, "signature": sign_thinking(thought)})
        has_tool = any(b["type"] == "tool_use" for b in content)
        stop = reply.get("stop_reason") or ("tool_use" if has_tool else "end_turn")
        output = sum(math.ceil(len(json.dumps(b)) / self.chars_per_token) for b in content)
        blocks = blocks or prompt_blocks(body, self.chars_per_token)
        usage = dict(self.cache.use(blocks, message_settings(body),
                                    self.min_cache_tokens or minimum_cacheable(body.get("model", ""))),
                     output_tokens=output)
        usage.update(reply.get("usage") or {})
        self.usage_log.append(dict(usage, summary=is_summary_request(body)))
        return {"id": f"msg_fake{next(self._ids):06d}", "type": "message", "role": "assistant",
                "model": body["model"], "content": content, "stop_reason": stop,
                "stop_sequence": None, "usage": usage}

    def _tool_id(self, name: str, k: int) -> str:
        """A generated tool_use id; `k` is the call's place among this reply's tool calls."""
        if self.tool_ids == "kimi":  # numbered within the reply, so the same ids recur next turn
            return f"functions.{name}:{k}"
        return f"toolu_fake{next(self._ids):06d}"


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that hung up mid-reply (Ctrl-C tests) is expected, not news


class _Handler(BaseHTTPRequestHandler):
    owner: FakeAnthropic
    protocol_version = "HTTP/1.1"
    prompt: list | None = None  # the prompt_blocks of the request being answered

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    # helpers -----------------------------------------------------------------
    def _send_json(self, status: int, payload, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_fake")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _error_headers(self, status: int) -> dict:
        # x-should-retry false keeps the SDK from retrying errors a test scripted once
        retry = "true" if status in (429, 500, 529) and getattr(self, "_retry_ok", False) else "false"
        headers = {"x-should-retry": retry}
        if status == 429 or status >= 500:
            headers["retry-after"] = str(getattr(self, "_retry_after", 0))  # tests need not wait
        return headers

    def _send_error(self, status: int, kind: str, message: str) -> None:
        self._send_json(status, {"type": "error", "error": {"type": kind, "message": message},
                                 "request_id": "req_fake"}, self._error_headers(status))

    def _send_empty(self, status: int, content_type: str | None = None) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("content-type", content_type)
        self.send_header("content-length", "0")
        for key, value in self._error_headers(status).items() if status >= 400 else ():
            self.send_header(key, value)
        self.end_headers()

    def _read_body(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        self.owner.bodies.append(raw)
        try:
            return json.loads(raw or b"null")
        except ValueError:
            return None

    def _authorized(self) -> bool:
        api_key, authorization = self.headers.get("x-api-key"), self.headers.get("authorization")
        self.owner.auth_headers.append({"x-api-key": api_key, "authorization": authorization})
        if self.owner.auth == "bearer":
            # OpenRouter-style: the key must come as a bearer token; x-api-key is not read
            scheme, _, token = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                self._send_error(401, "authentication_error",
                                 "Missing bearer token: send `Authorization: Bearer <key>` "
                                 "(this endpoint does not read x-api-key)")
                return False
            if token.strip() != self.owner.token:
                self._send_error(401, "authentication_error", "Invalid bearer token")
                return False
        elif not (api_key or authorization):
            self._send_error(401, "authentication_error", "x-api-key header is required")
            return False
        elif self.owner.auth == "litellm" and (api_key or authorization.partition(" ")[2]) != self.owner.token:
            # LiteLLM without a database knows only its master key, and says so oddly
            self._send_json(400, {"error": {"message": "No connected db.", "type": "no_db_connection", "param": None,
                                            "code": "400"}})
            return False
        if not self.headers.get("anthropic-version"):
            self._send_error(400, "invalid_request_error", "anthropic-version: header is required")
            return False
        return True

    # routes ------------------------------------------------------------------
    def do_GET(self) -> None:
        if not self._authorized():
            return
        path, owner = self.path.split("?")[0], self.owner
        if path == "/v1/models":
            self._list_models()
            return
        match = re.fullmatch(r"/v1/models/([^/?]+)", path)
        if not match:
            self._send_error(404, "not_found_error", "Not found")
            return
        model = urllib.parse.unquote(match.group(1))
        owner.model_lookups.append(model)
        if not owner.models_api or (owner.models is not None and owner.models_list == "openai"):
            self._send_error(404, "not_found_error", "Not found")
            return
        known = model in owner.models if owner.models is not None else owner.max_input_tokens is not None
        if not known:
            self._send_error(404, "not_found_error", f"model: {model}")
            return
        info = {"type": "model", "id": model, "display_name": model, "created_at": "2025-01-01T00:00:00Z"}
        if owner.max_input_tokens is not None:
            info.update(max_input_tokens=owner.max_input_tokens, max_tokens=owner.max_output_tokens)
        self._send_json(200, info)

    def _list_models(self) -> None:
        owner = self.owner
        owner.model_lists += 1
        if not owner.models_api or owner.models is None:
            self._send_error(404, "not_found_error", "Not found")
        elif owner.models_list == "openai":
            self._send_json(200, {"object": "list", "data": [
                {"id": model, "object": "model", "created": 1735689600, "owned_by": "fake"} for model in owner.models]})
        else:
            self._send_json(200, {"data": [{"type": "model", "id": model, "display_name": model,
                                            "created_at": "2025-01-01T00:00:00Z"} for model in owner.models],
                                  "has_more": False, "first_id": (owner.models or [None])[0],
                                  "last_id": (owner.models or [None])[-1]})

    def do_POST(self) -> None:
        path, self.prompt = self.path.split("?")[0], None
        if not self._authorized():
            return
        body = self._read_body()
        if not isinstance(body, dict):
            self._send_error(400, "invalid_request_error", "There was an error parsing the body of your request")
            return
        if path == "/v1/messages/count_tokens":
            self._count_tokens(body)
        elif path == "/v1/messages":
            self._messages(body)
        else:
            self._send_error(404, "not_found_error", "Not found")

    def _reject(self, message: str) -> None:
        """Refuse an invalid request with 400, as the real API does."""
        self.owner.invalid.append(message)
        self.owner.rejections.append(message)
        self._send_error(400, "invalid_request_error", message)

    def _count_tokens(self, body: dict) -> None:
        self.owner.count_token_calls += 1
        self.owner.count_requests.append(body)
        if not self.owner.count_tokens_api:
            self._send_error(404, "not_found_error", "Not found")
            return
        try:
            validate_request(body, need_max_tokens=False)
        except InvalidRequest as problem:
            self._reject(str(problem))
            return
        self._send_json(200, {"input_tokens": count_tokens(body, self.owner.chars_per_token)})

    def _messages(self, body: dict) -> None:
        owner = self.owner
        owner.requests.append(body)
        owner.request_times.append(time.monotonic())
        owner.received.set()
        try:
            validate_request(body)
            if owner.thinking:
                check_thinking_passback(body["messages"])
        except InvalidRequest as problem:
            self._reject(str(problem))
            return
        if owner.system_format == "string" and isinstance(body.get("system"), list):
            self._refuse_system_list(body["system"])
            return
        if owner.template == "strings" and not renders_as_strings(body["messages"]):
            owner.template_failures += 1  # a failure inside the server, not a refusal: not in rejections
            self._send_silent_failure(body)
            return
        if body["max_tokens"] > owner.max_output_tokens:
            self._reject(f"max_tokens: {body['max_tokens']} > {owner.max_output_tokens}, which is the maximum "
                         f"allowed number of output tokens for {body['model']}")
            return
        blocks = prompt_blocks(body, owner.chars_per_token)
        self.prompt = blocks  # measured once: the cache reads the same blocks for the reply
        tokens = sum(size for _, size, _ in blocks)
        overflow = OVERFLOWS[owner.overflow]
        needed = tokens + (body["max_tokens"] if overflow.counts_max_tokens else 0)
        if needed > owner.context_window:
            self._refuse_overflow(body, overflow, tokens)
            return
        body["_valid"] = True
        reply = owner.next_reply(body)
        time.sleep(reply.get("delay", 0))
        self._answer(body, reply)

    def _refuse_system_list(self, system: list) -> None:
        """LiteLLM passes a list-valued system prompt on; llama-cpp-python's pydantic model
        wants a string and lists each way the message failed to match, quoting it each time."""
        quoted = repr([{k: v for k, v in b.items() if k != "cache_control"} for b in system if isinstance(b, dict)])
        roles = ["ChatCompletionRequestSystemMessage", "ChatCompletionRequestUserMessage",
                 "ChatCompletionRequestAssistantMessage", "ChatCompletionRequestToolMessage",
                 "ChatCompletionRequestFunctionMessage"]
        lines = [f"  {{'type': 'string_type', 'loc': ('body', 'messages', 0, '{role}', 'content'), 'msg': "
                 f"'Input should be a valid string', 'input': {quoted}}}" for role in roles]
        message = ("litellm.InternalServerError: InternalServerError: OpenAIException - 10 validation errors:\n"
                   + "\n".join(lines) + "\n\nLiteLLM: model group 'smollm' failed with the error above. "
                   "No fallback was attempted.")
        self.owner.rejections.append("system must be a string")
        self._send_error(500, "api_error", message)

    def _send_silent_failure(self, body: dict) -> None:
        """A failure inside the server as LiteLLM relays it: streamed, a 200 with an empty text
        block and zero usage that ends in end_turn; not streamed, a 500."""
        if not body.get("stream"):
            self._send_error(500, "api_error", "litellm.InternalServerError: InternalServerError: OpenAIException - "
                                               "'dict object' has no attribute 'content'")
            return
        self._start_sse()
        zeros = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        start = dict(self._start_of(body), usage=zeros)
        self._event("message_start", {"type": "message_start", "message": start})
        self._block_start(0, {"type": "text", "text": ""})
        self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
        self._event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                      "usage": {"input_tokens": 0, "output_tokens": 0}})
        self._event("message_stop", {"type": "message_stop"})

    def _refuse_overflow(self, body: dict, overflow: Overflow, tokens: int) -> None:
        """Refuse a prompt too big for the window in the current overflow style."""
        message = overflow.text(tokens, body["max_tokens"], self.owner.context_window)
        recorded = {"empty": "413", "stop_reason": "model_context_window_exceeded"}.get(overflow.body, message)
        self.owner.overflows.append(recorded)
        self.owner.rejections.append(recorded)
        if overflow.body == "empty":
            self._send_empty(overflow.status)
        elif overflow.body == "silent" and body.get("stream"):
            self._send_silent_failure(body)
        elif overflow.body == "raw":
            self._send_json(overflow.status, overflow.raw, self._error_headers(overflow.status))
        elif overflow.body == "stop_reason":
            # nothing scripted is used up: the model never got to answer
            self._answer(body, {"content": [], "stop_reason": "model_context_window_exceeded", "think": False})
        else:
            self._send_error(overflow.status, overflow.kind, message)

    def _answer(self, body: dict, reply: dict) -> None:
        """Send a scripted reply: an error, a misbehaviour, or a message (JSON or streamed)."""
        owner = self.owner
        if "error" in reply:
            err = reply["error"]
            self._retry_ok = reply.get("retry", False)
            self._retry_after = reply.get("retry_after", 0)
            self._send_error(err["status"], err["type"], err["message"])
        elif "silent_failure" in reply:
            self._send_silent_failure(body)
        elif "held" in reply:
            outcome = self._hold(reply["gate"], reply["seconds"])
            if outcome != "released":
                owner.stalls.append(outcome)
                self.close_connection = True
                return
            self._answer(body, reply["held"])
        elif "hang" in reply:
            self.close_connection = True  # the client gets no response at all
            owner.stalls.append(self._stall(reply["hang"]))
        elif "drip" in reply:
            self._start_sse()
            self._event("message_start", {"type": "message_start", "message": self._start_of(body)})
            event = b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, ' \
                    b'"content_block": {"type": "text", "text": ""}}\n\n'
            for byte in event:
                if self._stall(reply["drip"]) != "timed out":
                    owner.stalls.append("client closed")
                    return
                try:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                except OSError:
                    owner.stalls.append("client closed")
                    return
            owner.stalls.append("timed out")
        elif "pings_only" in reply:
            self._start_sse()
            self._event("message_start", {"type": "message_start", "message": self._start_of(body)})
            owner.stalls.append(self._ping_for(reply["pings_only"], reply.get("ping_style", "event")))
        elif "error_event" in reply:
            self._start_sse()
            self._event("message_start", {"type": "message_start", "message": self._start_of(body)})
            self._event("error", {"type": "error", "error": reply["error_event"]})
        elif reply.get("malformed") == "sse_not_json":
            self._start_sse()
            self._event("message_start", {"type": "message_start", "message": self._start_of(body)})
            self.wfile.write(b"event: content_block_start\ndata: {not json\n\n")
        elif reply.get("malformed") == "bad_utf8":  # a byte that is not UTF-8 inside a text delta
            self._start_sse()
            self._event("message_start", {"type": "message_start", "message": self._start_of(body)})
            self._event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}})
            self.wfile.write(b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
                             b'"delta": {"type": "text_delta", "text": "caf\xe9 ok"}}\n\n')
            self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
            self._event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                          "usage": {"output_tokens": 3}})
            self._event("message_stop", {"type": "message_stop"})
        elif reply.get("malformed") == "empty_body":
            self._send_empty(200, "text/event-stream")
        elif reply.get("malformed") == "json_body":
            content = reply["reply"] or (owner.default_summary if is_summary_request(body) else owner.default_reply)
            self._send_message_json(owner.build_message(body, content, blocks=self.prompt))
        else:
            message = owner.build_message(body, reply, think=reply.get("think", True), blocks=self.prompt)
            if body.get("stream"):
                self._stream(message, reply)
            else:
                self._send_message_json(message)

    def _send_message_json(self, message: dict) -> None:
        self._send_json(200, dict(message, usage=reported_usage(self.owner.usage, message["usage"])))

    def _start_of(self, body: dict) -> dict:
        """The message_start message of a reply that never gets any content."""
        message = self.owner.build_message(body, {"content": []}, think=False, blocks=self.prompt)
        return dict(message, stop_reason=None, usage=streamed_usage(self.owner.usage, message["usage"])[0])

    # stalling ------------------------------------------------------------------
    def _client_gone(self, wait: float) -> bool:
        """Wait up to `wait` seconds for the client to close its end; True if it has."""
        try:
            readable, _, _ = select.select([self.connection], [], [], wait)
            if not readable:
                return False
            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                return True
        except OSError:
            return True
        time.sleep(wait)  # bytes we will not read (a pipelined request) keep it readable: do not spin
        return False

    def _stall(self, seconds: float | None) -> str:
        """Send nothing until the client hangs up, `seconds` pass, or the server shuts down."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            left = POLL_INTERVAL if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return "timed out"
            if self._client_gone(min(POLL_INTERVAL, left)):
                return "client closed"
            if self.owner._closing.is_set():
                return "server closed"

    def _hold(self, gate, seconds: float | None) -> str:
        """Wait for the gate or the time, unless the client hangs up or the server shuts down."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not (gate is not None and gate.is_set()):
            left = POLL_INTERVAL if deadline is None else min(POLL_INTERVAL, deadline - time.monotonic())
            if left <= 0:
                break
            if self._client_gone(left):
                return "client closed"
            if self.owner._closing.is_set():
                return "server closed"
        return "released"

    def _ping_for(self, seconds: float, style: str = "event") -> str:
        """Send a ping every PING_INTERVAL for `seconds`, unless the client or server goes first."""
        keep_alive = {"event": b'event: ping\ndata: {"type": "ping"}\n\n', "data": b'data: {"type": "ping"}\n\n',
                      "comment": b": OPENROUTER PROCESSING\n\n"}[style]
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            outcome = self._stall(min(PING_INTERVAL, left))
            if outcome != "timed out":
                return outcome
            try:
                self.wfile.write(keep_alive)
                self.wfile.flush()
            except OSError:
                return "client closed"
        return "timed out"

    # streaming -----------------------------------------------------------------
    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True

    def _event(self, name: str, data: dict) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _stream(self, message: dict, reply: dict) -> None:
        self._start_sse()
        start_usage, delta_usage = streamed_usage(self.owner.usage, message["usage"])
        start = dict(message, content=[], stop_reason=None, usage=start_usage)
        self._event("message_start", {"type": "message_start", "message": start})
        self._event("ping", {"type": "ping"})
        index = 0
        for k, block in enumerate(message["content"]):
            if block["type"] == "tool_use" and self.owner.tool_stream == "pieces":
                index = self._stream_tool_pieces(index, block)
                continue
            self._stream_block(index, block, reply.get("chunk_delay", 0), reply.get("split_surrogates", False))
            index += 1
            if reply.get("drop_after_block") == k:
                return  # the connection closes mid-stream, as a dropped network would
        delta = {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None}}
        if delta_usage is not None:
            delta["usage"] = delta_usage
        self._event("message_delta", delta)
        self._event("message_stop", {"type": "message_stop"})

    def _stream_block(self, index: int, block: dict, chunk_delay: float, split: bool = False) -> None:
        kind = block["type"]
        if kind == "text":
            self._block_start(index, {"type": "text", "text": ""})
            self._deltas(index, "text_delta", "text", block["text"], chunk_delay, split=split)
        elif kind == "thinking":
            self._block_start(index, {"type": "thinking", "thinking": "", "signature": ""})
            self._deltas(index, "thinking_delta", "thinking", block["thinking"], chunk_delay, split=split)
            self._delta(index, {"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            self._block_start(index, dict(block, input={}))
            # RawJSON goes out verbatim; anything else (dict, str, list) as its JSON, an emoji in it
            # as itself when it is to be split (escaped, its halves would be ASCII text)
            payload = block["input"] if isinstance(block["input"], RawJSON) else \
                json.dumps(block["input"], ensure_ascii=not split)
            self._deltas(index, "input_json_delta", "partial_json", payload, 0, at_least_one=False, split=split,
                         size=400)
        else:
            self._block_start(index, block)  # redacted_thinking and the like arrive whole
        self._event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _stream_tool_pieces(self, index: int, block: dict) -> int:
        """A tool call as LiteLLM relays llama.cpp's chunks: a tool_use block per piece of its
        JSON (a few characters, as tokens come), each repeating the id and name, then one
        more with nothing in it. Returns the next free index."""
        payload = json.dumps(block["input"]) if not isinstance(block["input"], RawJSON) else block["input"]
        pieces = [payload[start:start + 4] for start in range(0, len(payload), 4)] + [""]
        for piece in pieces:
            self._block_start(index, dict(block, input={}))
            if piece:
                self._delta(index, {"type": "input_json_delta", "partial_json": piece})
            self._event("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
        return index

    def _block_start(self, index: int, block: dict) -> None:
        self._event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})

    def _delta(self, index: int, delta: dict) -> None:
        self._event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def _deltas(self, index: int, kind: str, key: str, value: str, chunk_delay: float,
                at_least_one: bool = True, split: bool = False, size: int = 40) -> None:
        """Stream `value` in pieces of `size` characters (text: 40, and one even when empty; a
        tool's input: 400, as a long one comes in many); split: a character beyond the BMP as
        its two UTF-16 halves, a piece ending between them."""
        pieces = [value[start:start + size] for start in range(0, len(value), size)] or ([""] if at_least_one else [])
        if split:
            pieces = [part for piece in pieces for part in utf16_pieces(piece)]
        for piece in pieces:
            if chunk_delay:
                time.sleep(chunk_delay)
            self._delta(index, {"type": kind, key: piece})
