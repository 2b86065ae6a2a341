"""The fake server itself: `FakeAnthropic`, a scripted Messages API on 127.0.0.1 used as a
context manager. It holds the scripts (`replies`, `summaries`), the provider settings
(checked against `CHOICES`), the prompt cache and everything it records (requests,
rejections, usage, stalls), and builds each reply's message; the HTTP side is handler.py's."""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections import deque
from http.server import ThreadingHTTPServer

from .counting import (MIN_CACHEABLE_TOKENS, PromptCache, message_settings, minimum_cacheable,
                       prompt_blocks)
from .handler import _Handler, _QuietServer
from .providers import (AUTH_STYLES, MODELS_LIST_STYLES, OVERFLOWS, SYSTEM_FORMATS, TEMPLATES,
                        TOOL_ID_STYLES, TOOL_STREAMS, USAGE_STYLES, sign_thinking)
from .replies import text
from .validation import is_summary_request


# ---------------------------------------------------------------- the server

# attributes whose value must be one of a fixed set of names
CHOICES = {"overflow": tuple(OVERFLOWS), "usage": USAGE_STYLES, "auth": AUTH_STYLES,
           "tool_ids": TOOL_ID_STYLES, "system_format": SYSTEM_FORMATS,
           "tool_stream": TOOL_STREAMS, "template": TEMPLATES,
           "models_list": MODELS_LIST_STYLES}


class FakeAnthropic:
    """A scripted Messages API. Use as a context manager; `url` goes into base_url."""

    def __init__(self, *, context_window: int = 200_000, max_input_tokens: int | None = None,
                 max_output_tokens: int = 64_000, chars_per_token: float = 3.5,
                 min_cache_tokens: int | None = None, overflow: str = "anthropic",
                 models_api: bool = True, count_tokens_api: bool = True, usage: str = "anthropic",
                 auth: str = "any", token: str = "test", thinking: bool = False,
                 tool_ids: str = "anthropic", models: list | None = None,
                 models_list: str = "anthropic", system_format: str = "any",
                 tool_stream: str = "whole", template: str = "any", clock=time.monotonic):
        self.context_window, self.max_input_tokens = context_window, max_input_tokens
        self.max_output_tokens, self.chars_per_token = max_output_tokens, chars_per_token
        # provider behaviours (see the module docstring); tests may change them at any time
        self.overflow, self.models_api = overflow, models_api
        self.count_tokens_api = count_tokens_api
        self.usage, self.auth, self.token = usage, auth, token
        self.thinking, self.tool_ids = thinking, tool_ids
        self.models, self.models_list = models, models_list
        self.system_format, self.tool_stream, self.template = system_format, tool_stream, template
        self.template_failures = 0           # requests the "strings" template could not render
        self.replies: deque = deque()
        self.summaries: deque = deque()
        self.min_cache_tokens = min_cache_tokens  # None: by the model's family, as the API does
        # clock: the benchmark's own
        self.cache = PromptCache(min_cache_tokens or MIN_CACHEABLE_TOKENS, clock)
        self.usage_log: list[dict] = []      # the usage of every answered request, summary or not
        self.requests: list[dict] = []       # every POST /v1/messages body, in order, valid or not
        # every POST body exactly as it arrived (JSON text, not parsed)
        self.bodies: list[bytes] = []
        self.rejections: list[str] = []      # messages of every refusal below, in order
        self.invalid: list[str] = []         # messages of the 400s for invalid requests
        # messages of the refusals for a prompt too big for the window
        self.overflows: list[str] = []
        # {"x-api-key": ..., "authorization": ...} of every request
        self.auth_headers: list[dict] = []
        self.stalls: list[str] = []          # how each hang or pings_only reply ended
        self.count_token_calls = 0
        self.count_requests: list[dict] = []  # every count_tokens body, as received
        self.model_lookups: list[str] = []   # GET /v1/models/{id}
        self.model_lists = 0                 # GET /v1/models
        self.request_times: list[float] = []  # time.monotonic() of every POST /v1/messages
        # (kind, arrived, answered) of every POST, time.monotonic(): kind is "main", "summary"
        # (is_summary_request), "count" (count_tokens) or "refused" (any request not answered)
        self.timeline: list[tuple] = []
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
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                         daemon=True).start()
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

    def build_message(self, body: dict, reply: dict, think: bool = True,
                      blocks: list | None = None) -> dict:
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
        starts_thinking = content and content[0]["type"] in ("thinking", "redacted_thinking")
        if think and self.thinking and not starts_thinking:
            thought = f"Working out reply {next(self._ids)} before answering."
            content.insert(0, {"type": "thinking", "thinking": thought,
                               "signature": sign_thinking(thought)})
        has_tool = any(b["type"] == "tool_use" for b in content)
        stop = reply.get("stop_reason") or ("tool_use" if has_tool else "end_turn")
        output = sum(math.ceil(len(json.dumps(b)) / self.chars_per_token) for b in content)
        blocks = blocks or prompt_blocks(body, self.chars_per_token)
        minimum = self.min_cache_tokens or minimum_cacheable(body.get("model", ""))
        usage = dict(self.cache.use(blocks, message_settings(body), minimum),
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
