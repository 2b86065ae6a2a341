"""A fake Anthropic Messages API on 127.0.0.1, for tests that must not touch the network.

It speaks the wire format the real API speaks, so the real `anthropic` SDK can be
pointed at it with ANTHROPIC_BASE_URL:

- POST /v1/messages               JSON, or SSE when the body has "stream": true
- POST /v1/messages/count_tokens
- GET  /v1/models/{id}

Every request is validated the way the real API validates it (tool pairing, block
order, empty text, tool schemas) and rejected with the real error texts. The context
window is enforced with the real "prompt is too long: N tokens > M maximum" error.

Replies are scripted. Requests that offer tools the model may call go to `replies`;
summary requests (no tools, or tool_choice "none") go to `summaries`. Each scripted
item is a reply dict (see `text`, `tool_use`, `error`) or a callable that receives
the request body and returns one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
MAX_CACHE_BREAKPOINTS = 4
CACHE_LOOKBACK_BLOCKS = 20   # the API looks this many blocks back from a breakpoint for a hit
MIN_CACHEABLE_TOKENS = 1024  # shorter prefixes are not cached


# ---------------------------------------------------------------- reply builders

def text(body: str, **extra) -> dict:
    """A reply whose content is one text block."""
    return {"content": [{"type": "text", "text": body}], **extra}


def tool_use(name: str, input: dict, id: str | None = None, preface: str | None = None) -> dict:
    """A reply that calls one tool (optionally after a sentence of text)."""
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


def overloaded() -> dict:
    return error(529, "overloaded_error", "Overloaded")


def server_error() -> dict:
    return error(500, "api_error", "Internal server error")


# ---------------------------------------------------------------- validation

class InvalidRequest(Exception):
    """A request the real API would answer with 400 invalid_request_error."""


def is_summary_request(body: dict) -> bool:
    choice = body.get("tool_choice") or {}
    return not body.get("tools") or choice.get("type") == "none"


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
        if isinstance(content, str):
            if message["role"] == "user" and not content.strip():
                raise InvalidRequest(f"messages.{i}: user messages must have non-empty content")
            continue
        if not isinstance(content, list):
            raise InvalidRequest(f"messages.{i}.content: Input should be a valid string or list")
        if message["role"] == "user" and not content:
            raise InvalidRequest(f"messages.{i}: user messages must have non-empty content")
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
        blocks.append((key, tokens, "cache_control" in block))
    return blocks


def count_tokens(body: dict, chars_per_token: float = 3.5) -> int:
    """A deterministic stand-in for the tokenizer.

    ASCII text costs 1/chars_per_token tokens a character; any other character costs
    one token (close to the real tokenizer for Chinese, Japanese and Korean).
    """
    return sum(tokens for _, tokens, _ in prompt_blocks(body, chars_per_token))


class PromptCache:
    """The API's prefix cache: a prefix up to a breakpoint is written; a later request
    reads the longest cached prefix found at, or up to 20 blocks before, its breakpoints."""

    def __init__(self, min_tokens: int = MIN_CACHEABLE_TOKENS):
        self.min_tokens = min_tokens
        self.prefixes: set = set()
        self.lock = threading.Lock()

    def use(self, blocks: list) -> dict:
        hashes, cumulative, digest, total = [], [], hashlib.sha256(), 0
        for key, tokens, _ in blocks:
            digest.update(key.encode("utf-8", "surrogatepass"))
            hashes.append(digest.copy().hexdigest())
            total += tokens
            cumulative.append(total)
        breakpoints = [i for i, (_, _, marked) in enumerate(blocks) if marked]
        with self.lock:
            read = 0
            for b in breakpoints:
                for p in range(b, max(b - CACHE_LOOKBACK_BLOCKS, -1), -1):
                    if hashes[p] in self.prefixes:
                        read = max(read, cumulative[p])
                        break
            written = 0
            for b in breakpoints:
                if cumulative[b] >= self.min_tokens:
                    self.prefixes.add(hashes[b])
                    written = max(written, cumulative[b])
        creation = max(0, written - read)
        return {"input_tokens": total - read - creation, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": creation}


# ---------------------------------------------------------------- the server

class FakeAnthropic:
    """A scripted Messages API. Use as a context manager; `url` goes into base_url."""

    def __init__(self, *, context_window: int = 200_000, max_input_tokens: int | None = None,
                 max_output_tokens: int = 64_000, chars_per_token: float = 3.5, min_cache_tokens: int = 1024):
        self.context_window = context_window
        self.max_input_tokens = max_input_tokens
        self.max_output_tokens = max_output_tokens
        self.chars_per_token = chars_per_token
        self.replies: deque = deque()
        self.summaries: deque = deque()
        self.cache = PromptCache(min_cache_tokens)
        self.usage_log: list[dict] = []      # the usage of every answered request, summary or not
        self.requests: list[dict] = []       # every POST /v1/messages body, in order, valid or not
        self.rejections: list[str] = []      # error messages of the 400s it answered
        self.count_token_calls = 0
        self.model_lookups: list[str] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.received = threading.Event()    # set on every /v1/messages request
        self.default_reply = text("Done.")   # answers when the script has run out
        self.default_summary = text("<summary>Fake summary of the conversation.</summary>")

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

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
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

    def build_message(self, body: dict, reply: dict) -> dict:
        content = []
        for block in reply["content"]:
            block = dict(block)
            if block["type"] == "tool_use" and not block.get("id"):
                block["id"] = f"toolu_fake{next(self._ids):06d}"
            content.append(block)
        has_tool = any(b["type"] == "tool_use" for b in content)
        stop = reply.get("stop_reason") or ("tool_use" if has_tool else "end_turn")
        output = sum(math.ceil(len(json.dumps(b)) / self.chars_per_token) for b in content)
        usage = dict(self.cache.use(prompt_blocks(body, self.chars_per_token)), output_tokens=output)
        usage.update(reply.get("usage") or {})
        self.usage_log.append(dict(usage, summary=is_summary_request(body)))
        return {"id": f"msg_fake{next(self._ids):06d}", "type": "message", "role": "assistant",
                "model": body["model"], "content": content, "stop_reason": stop,
                "stop_sequence": None, "usage": usage}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that hung up mid-reply (Ctrl-C tests) is expected, not news


class _Handler(BaseHTTPRequestHandler):
    owner: FakeAnthropic
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    # helpers -----------------------------------------------------------------
    def _send_json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_fake")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, kind: str, message: str) -> None:
        # x-should-retry false keeps the SDK from retrying errors a test scripted once
        retry = "true" if status in (429, 500, 529) and getattr(self, "_retry_ok", False) else "false"
        headers = {"x-should-retry": retry}
        if status == 429 or status >= 500:
            headers["retry-after"] = str(getattr(self, "_retry_after", 0))  # tests need not wait
        self._send_json(status, {"type": "error", "error": {"type": kind, "message": message},
                                 "request_id": "req_fake"}, headers)

    def _read_body(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            return json.loads(raw or b"null")
        except ValueError:
            return None

    def _authorized(self) -> bool:
        if not (self.headers.get("x-api-key") or self.headers.get("authorization")):
            self._send_error(401, "authentication_error", "x-api-key header is required")
            return False
        if not self.headers.get("anthropic-version"):
            self._send_error(400, "invalid_request_error", "anthropic-version: header is required")
            return False
        return True

    # routes ------------------------------------------------------------------
    def do_GET(self) -> None:
        if not self._authorized():
            return
        match = re.fullmatch(r"/v1/models/([^/?]+)", self.path.split("?")[0])
        if not match:
            self._send_error(404, "not_found_error", "Not found")
            return
        model = match.group(1)
        self.owner.model_lookups.append(model)
        if self.owner.max_input_tokens is None:
            self._send_error(404, "not_found_error", f"model: {model}")
            return
        self._send_json(200, {"type": "model", "id": model, "display_name": model,
                              "created_at": "2025-01-01T00:00:00Z",
                              "max_input_tokens": self.owner.max_input_tokens,
                              "max_tokens": self.owner.max_output_tokens})

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
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
        self.owner.rejections.append(message)
        self._send_error(400, "invalid_request_error", message)

    def _count_tokens(self, body: dict) -> None:
        self.owner.count_token_calls += 1
        try:
            validate_request(body, need_max_tokens=False)
        except InvalidRequest as problem:
            self._reject(str(problem))
            return
        self._send_json(200, {"input_tokens": count_tokens(body, self.owner.chars_per_token)})

    def _messages(self, body: dict) -> None:
        owner = self.owner
        owner.requests.append(body)
        owner.received.set()
        try:
            validate_request(body)
        except InvalidRequest as problem:
            self._reject(str(problem))
            return
        if body["max_tokens"] > owner.max_output_tokens:
            self._reject(f"max_tokens: {body['max_tokens']} > {owner.max_output_tokens}, which is the maximum "
                         f"allowed number of output tokens for {body['model']}")
            return
        tokens = count_tokens(body, owner.chars_per_token)
        if tokens > owner.context_window:
            self._reject(f"prompt is too long: {tokens} tokens > {owner.context_window} maximum")
            return
        body["_valid"] = True
        reply = owner.next_reply(body)
        time.sleep(reply.get("delay", 0))
        if "error" in reply:
            err = reply["error"]
            self._retry_ok = reply.get("retry", False)
            self._retry_after = reply.get("retry_after", 0)
            self._send_error(err["status"], err["type"], err["message"])
            return
        message = owner.build_message(body, reply)
        if body.get("stream"):
            self._stream(message, reply)
        else:
            self._send_json(200, message)

    def _event(self, name: str, data: dict) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _stream(self, message: dict, reply: dict) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        start = dict(message, content=[], stop_reason=None,
                     usage=dict(message["usage"], output_tokens=1))
        self._event("message_start", {"type": "message_start", "message": start})
        self._event("ping", {"type": "ping"})
        for index, block in enumerate(message["content"]):
            self._stream_block(index, block, reply.get("chunk_delay", 0))
            if reply.get("drop_after_block") == index:
                return  # the connection closes mid-stream, as a dropped network would
        self._event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                       "usage": {"output_tokens": message["usage"]["output_tokens"]}})
        self._event("message_stop", {"type": "message_stop"})

    def _stream_block(self, index: int, block: dict, chunk_delay: float) -> None:
        if block["type"] == "text":
            self._event("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": {"type": "text", "text": ""}})
            body = block["text"]
            for start in range(0, len(body), 40) or [0]:
                time.sleep(chunk_delay)
                self._event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "text_delta", "text": body[start:start + 40]}})
        else:
            self._event("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": dict(block, input={})})
            payload = json.dumps(block["input"])
            for start in range(0, len(payload), 40):
                self._event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "input_json_delta",
                                                              "partial_json": payload[start:start + 40]}})
        self._event("content_block_stop", {"type": "content_block_stop", "index": index})
