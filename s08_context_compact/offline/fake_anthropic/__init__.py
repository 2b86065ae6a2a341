"""A fake Anthropic Messages API on 127.0.0.1, for tests that must not touch the network.

It speaks the wire format the real API speaks, so the real `anthropic` SDK can be
pointed at it with ANTHROPIC_BASE_URL:

- POST /v1/messages               JSON, or SSE when the body has "stream": true
- POST /v1/messages/count_tokens
- GET  /v1/models/{id}, GET /v1/models

Every request is validated the way the real API validates it (tool pairing, block
order, empty messages and text, tool schemas) and rejected with the real error texts. The
context window is enforced with the real "prompt is too long: N tokens > M maximum" error.

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
- template="any"         "strings": the chat template behind the proxy concatenates
                         strings (SmolLM2's, as llama.cpp renders it): a message whose text
                         comes as a list of blocks, text beside tool results, or a call
                         with no text beside it fails inside the server, as a silent
                         failure.
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
`held(reply, gate, seconds)` sends a reply only once a test sets `gate` (or the time
passes): a slow summary, released when the test chooses. `stalls` records how each hang,
held or ping-only reply ended: "client closed", "timed out" or "server closed".
`split_surrogates(reply)` streams each emoji as two UTF-16 halves in two deltas.

The package
-----------
Every name is importable from the package itself, as it was from the single file before:
replies.py holds the reply builders, providers.py the provider behaviours (`OVERFLOWS`,
`PROVIDERS`, the usage styles), validation.py the request validation, counting.py the token
counting and `PromptCache`, server.py `FakeAnthropic`, and handler.py its HTTP handler.
The files import one another only relatively, so with `offline/` on sys.path
`import fake_anthropic` works too.
"""

from .counting import (CACHE_LOOKBACK_BLOCKS, CACHE_TTL_SECONDS, MIN_CACHEABLE_BY_MODEL,
                       MIN_CACHEABLE_TOKENS, PromptCache, _piece_tokens, _strings, count_tokens,
                       message_settings, minimum_cacheable, prompt_blocks)
from .handler import POLL_INTERVAL, PING_INTERVAL, _Handler, _QuietServer
from .providers import (AUTH_STYLES, MODELS_LIST_STYLES, OVERFLOWS, PROVIDERS, SYSTEM_FORMATS,
                        TEMPLATES, THINKING_KEY, TOOL_ID_STYLES, TOOL_STREAMS, USAGE_STYLES,
                        Overflow, reported_usage, sign_thinking, streamed_usage)
from .replies import (MALFORMED, RawJSON, broken_tool_json, drip, error, error_event, hang, held,
                      malformed, overloaded, pings_only, server_error, silent_failure,
                      split_surrogates, text, tool_use, tool_uses, utf16_pieces)
from .server import CHOICES, FakeAnthropic
from .validation import (MAX_CACHE_BREAKPOINTS, SUMMARY_OPENING, TOOL_NAME_RE, InvalidRequest,
                         _blocks, _check_block, _check_pairing, _check_text_block,
                         _check_tool_result_content, _count_cache_breakpoints,
                         _merge_consecutive, check_thinking_passback, is_summary_request,
                         renders_as_strings, validate_request)

# Every top-level name of the files above, the private ones too: all were importable from the
# single fake_anthropic.py, and readers' tests may use any of them.
__all__ = [
    # replies.py
    "text", "tool_use", "tool_uses", "error", "split_surrogates", "utf16_pieces", "overloaded",
    "server_error", "RawJSON", "broken_tool_json", "MALFORMED", "malformed", "error_event",
    "silent_failure", "hang", "held", "drip", "pings_only",
    # providers.py
    "Overflow", "OVERFLOWS", "USAGE_STYLES", "AUTH_STYLES", "TOOL_ID_STYLES", "SYSTEM_FORMATS",
    "TEMPLATES", "TOOL_STREAMS", "MODELS_LIST_STYLES", "PROVIDERS", "THINKING_KEY",
    "sign_thinking", "reported_usage", "streamed_usage",
    # validation.py
    "TOOL_NAME_RE", "MAX_CACHE_BREAKPOINTS", "InvalidRequest", "SUMMARY_OPENING",
    "is_summary_request", "_check_text_block", "_check_tool_result_content", "_check_block",
    "_blocks", "_merge_consecutive", "_check_pairing", "_count_cache_breakpoints",
    "validate_request", "renders_as_strings", "check_thinking_passback",
    # counting.py
    "CACHE_LOOKBACK_BLOCKS", "MIN_CACHEABLE_TOKENS", "MIN_CACHEABLE_BY_MODEL", "CACHE_TTL_SECONDS",
    "_strings", "_piece_tokens", "prompt_blocks", "count_tokens", "message_settings",
    "minimum_cacheable", "PromptCache",
    # server.py
    "CHOICES", "FakeAnthropic",
    # handler.py
    "PING_INTERVAL", "POLL_INTERVAL", "_QuietServer", "_Handler",
]
