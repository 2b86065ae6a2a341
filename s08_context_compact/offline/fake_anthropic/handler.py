"""The HTTP side of the fake Messages API: `_Handler` answers each request for the
`FakeAnthropic` that owns it (authentication, routes, validation, overflow refusals, scripted
replies as JSON or as SSE, stalls and keep-alives), and `_QuietServer` is the threading HTTP
server that runs it without printing the errors of clients that hung up."""

from __future__ import annotations

import json
import re
import select
import socket
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from .counting import count_tokens, prompt_blocks
from .providers import OVERFLOWS, Overflow, reported_usage, streamed_usage
from .replies import RawJSON, utf16_pieces
from .validation import (InvalidRequest, check_thinking_passback, is_summary_request,
                         renders_as_strings, validate_request)

if TYPE_CHECKING:  # only for the annotation of `owner`: server.py imports this file
    from .server import FakeAnthropic

PING_INTERVAL = 0.2          # seconds between the pings of a `pings_only` reply
POLL_INTERVAL = 0.02         # how often a stalled reply looks for a hang-up or a shutdown


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
        retry = ("true" if status in (429, 500, 529) and getattr(self, "_retry_ok", False)
                 else "false")
        headers = {"x-should-retry": retry}
        if status == 429 or status >= 500:
            # tests need not wait
            headers["retry-after"] = str(getattr(self, "_retry_after", 0))
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
        elif (self.owner.auth == "litellm"
              and (api_key or authorization.partition(" ")[2]) != self.owner.token):
            # LiteLLM without a database knows only its master key, and says so oddly
            self._send_json(400, {"error": {"message": "No connected db.",
                                            "type": "no_db_connection", "param": None,
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
        known = (model in owner.models if owner.models is not None
                 else owner.max_input_tokens is not None)
        if not known:
            self._send_error(404, "not_found_error", f"model: {model}")
            return
        info = {"type": "model", "id": model, "display_name": model,
                "created_at": "2025-01-01T00:00:00Z"}
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
                {"id": model, "object": "model", "created": 1735689600, "owned_by": "fake"}
                for model in owner.models]})
        else:
            self._send_json(200, {"data": [{"type": "model", "id": model, "display_name": model,
                                            "created_at": "2025-01-01T00:00:00Z"}
                                           for model in owner.models],
                                  "has_more": False, "first_id": (owner.models or [None])[0],
                                  "last_id": (owner.models or [None])[-1]})

    def do_POST(self) -> None:
        arrived, self.kind = time.monotonic(), "refused"
        try:
            self._post()
        finally:
            self.owner.timeline.append((self.kind, arrived, time.monotonic()))

    def _post(self) -> None:
        path, self.prompt = self.path.split("?")[0], None
        if not self._authorized():
            return
        body = self._read_body()
        if not isinstance(body, dict):
            self._send_error(400, "invalid_request_error",
                             "There was an error parsing the body of your request")
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
        self.kind = "count"
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
            # a failure inside the server, not a refusal: not in rejections
            owner.template_failures += 1
            self._send_silent_failure(body)
            return
        if body["max_tokens"] > owner.max_output_tokens:
            self._reject(f"max_tokens: {body['max_tokens']} > {owner.max_output_tokens}, "
                         "which is the maximum allowed number of output tokens "
                         f"for {body['model']}")
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
        self.kind = "summary" if is_summary_request(body) else "main"
        reply = owner.next_reply(body)
        time.sleep(reply.get("delay", 0))
        self._answer(body, reply)

    def _refuse_system_list(self, system: list) -> None:
        """LiteLLM passes a list-valued system prompt on; llama-cpp-python's pydantic model
        wants a string and lists each way the message failed to match, quoting it each time."""
        quoted = repr([{k: v for k, v in b.items() if k != "cache_control"}
                       for b in system if isinstance(b, dict)])
        roles = ["ChatCompletionRequestSystemMessage", "ChatCompletionRequestUserMessage",
                 "ChatCompletionRequestAssistantMessage", "ChatCompletionRequestToolMessage",
                 "ChatCompletionRequestFunctionMessage"]
        lines = [f"  {{'type': 'string_type', "
                 f"'loc': ('body', 'messages', 0, '{role}', 'content'), 'msg': "
                 f"'Input should be a valid string', 'input': {quoted}}}" for role in roles]
        message = ("litellm.InternalServerError: InternalServerError: "
                   "OpenAIException - 10 validation errors:\n"
                   + "\n".join(lines)
                   + "\n\nLiteLLM: model group 'smollm' failed with the error above. "
                   "No fallback was attempted.")
        self.owner.rejections.append("system must be a string")
        self._send_error(500, "api_error", message)

    def _send_silent_failure(self, body: dict) -> None:
        """A failure inside the server as LiteLLM relays it: streamed, a 200 with an empty text
        block and zero usage that ends in end_turn; not streamed, a 500."""
        if not body.get("stream"):
            self._send_error(500, "api_error",
                             "litellm.InternalServerError: InternalServerError: OpenAIException - "
                             "'dict object' has no attribute 'content'")
            return
        self._start_sse()
        zeros = {"input_tokens": 0, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
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
        recorded = {"empty": "413",
                    "stop_reason": "model_context_window_exceeded"}.get(overflow.body, message)
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
            self._answer(body, {"content": [], "stop_reason": "model_context_window_exceeded",
                                "think": False})
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
            event = (b'event: content_block_start\n'
                     b'data: {"type": "content_block_start", "index": 0, '
                     b'"content_block": {"type": "text", "text": ""}}\n\n')
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
            owner.stalls.append(self._ping_for(reply["pings_only"],
                                               reply.get("ping_style", "event")))
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
            self.wfile.write(b'event: content_block_delta\n'
                             b'data: {"type": "content_block_delta", "index": 0, '
                             b'"delta": {"type": "text_delta", "text": "caf\xe9 ok"}}\n\n')
            self._event("content_block_stop", {"type": "content_block_stop", "index": 0})
            self._event("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": "end_turn"},
                                          "usage": {"output_tokens": 3}})
            self._event("message_stop", {"type": "message_stop"})
        elif reply.get("malformed") == "empty_body":
            self._send_empty(200, "text/event-stream")
        elif reply.get("malformed") == "json_body":
            content = reply["reply"] or (owner.default_summary if is_summary_request(body)
                                         else owner.default_reply)
            self._send_message_json(owner.build_message(body, content, blocks=self.prompt))
        else:
            message = owner.build_message(body, reply, think=reply.get("think", True),
                                          blocks=self.prompt)
            if body.get("stream"):
                self._stream(message, reply)
            else:
                self._send_message_json(message)

    def _send_message_json(self, message: dict) -> None:
        self._send_json(200, dict(message,
                                  usage=reported_usage(self.owner.usage, message["usage"])))

    def _start_of(self, body: dict) -> dict:
        """The message_start message of a reply that never gets any content."""
        message = self.owner.build_message(body, {"content": []}, think=False, blocks=self.prompt)
        return dict(message, stop_reason=None,
                    usage=streamed_usage(self.owner.usage, message["usage"])[0])

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
        # bytes we will not read (a pipelined request) keep it readable: do not spin
        time.sleep(wait)
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
            left = (POLL_INTERVAL if deadline is None
                    else min(POLL_INTERVAL, deadline - time.monotonic()))
            if left <= 0:
                break
            if self._client_gone(left):
                return "client closed"
            if self.owner._closing.is_set():
                return "server closed"
        return "released"

    def _ping_for(self, seconds: float, style: str = "event") -> str:
        """Send a ping every PING_INTERVAL for `seconds`, unless the client or server goes first."""
        keep_alive = {"event": b'event: ping\ndata: {"type": "ping"}\n\n',
                      "data": b'data: {"type": "ping"}\n\n',
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
            self._stream_block(index, block, reply.get("chunk_delay", 0),
                               reply.get("split_surrogates", False))
            index += 1
            if reply.get("drop_after_block") == k:
                return  # the connection closes mid-stream, as a dropped network would
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None}}
        if delta_usage is not None:
            delta["usage"] = delta_usage
        self._event("message_delta", delta)
        self._event("message_stop", {"type": "message_stop"})

    def _stream_block(self, index: int, block: dict, chunk_delay: float,
                      split: bool = False) -> None:
        kind = block["type"]
        if kind == "text":
            self._block_start(index, {"type": "text", "text": ""})
            self._deltas(index, "text_delta", "text", block["text"], chunk_delay, split=split)
        elif kind == "thinking":
            self._block_start(index, {"type": "thinking", "thinking": "", "signature": ""})
            self._deltas(index, "thinking_delta", "thinking", block["thinking"], chunk_delay,
                         split=split)
            self._delta(index, {"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            self._block_start(index, dict(block, input={}))
            # RawJSON goes out verbatim; anything else (dict, str, list) as its JSON,
            # an emoji in it as itself when it is to be split
            # (escaped, its halves would be ASCII text)
            payload = block["input"] if isinstance(block["input"], RawJSON) else \
                json.dumps(block["input"], ensure_ascii=not split)
            self._deltas(index, "input_json_delta", "partial_json", payload, 0,
                         at_least_one=False, split=split, size=400)
        else:
            self._block_start(index, block)  # redacted_thinking and the like arrive whole
        self._event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _stream_tool_pieces(self, index: int, block: dict) -> int:
        """A tool call as LiteLLM relays llama.cpp's chunks: a tool_use block per piece of its
        JSON (a few characters, as tokens come), each repeating the id and name, then one
        more with nothing in it. Returns the next free index."""
        payload = (json.dumps(block["input"]) if not isinstance(block["input"], RawJSON)
                   else block["input"])
        pieces = [payload[start:start + 4] for start in range(0, len(payload), 4)] + [""]
        for piece in pieces:
            self._block_start(index, dict(block, input={}))
            if piece:
                self._delta(index, {"type": "input_json_delta", "partial_json": piece})
            self._event("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
        return index

    def _block_start(self, index: int, block: dict) -> None:
        self._event("content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": block})

    def _delta(self, index: int, delta: dict) -> None:
        self._event("content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta})

    def _deltas(self, index: int, kind: str, key: str, value: str, chunk_delay: float,
                at_least_one: bool = True, split: bool = False, size: int = 40) -> None:
        """Stream `value` in pieces of `size` characters (text: 40, and one even when empty; a
        tool's input: 400, as a long one comes in many); split: a character beyond the BMP as
        its two UTF-16 halves, a piece ending between them."""
        pieces = ([value[start:start + size] for start in range(0, len(value), size)]
                  or ([""] if at_least_one else []))
        if split:
            pieces = [part for piece in pieces for part in utf16_pieces(piece)]
        for piece in pieces:
            if chunk_delay:
                time.sleep(chunk_delay)
            self._delta(index, {"type": kind, key: piece})
