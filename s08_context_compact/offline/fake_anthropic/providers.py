"""Provider behaviours of the fake Messages API: how Anthropic-compatible endpoints differ
from Anthropic. `Overflow` and `OVERFLOWS` (how a prompt too big for the window is refused),
the names each behaviour may take (`USAGE_STYLES`, `AUTH_STYLES`, ...), `PROVIDERS` (the
settings of each provider, bundled), the signing of thinking blocks (`sign_thinking`), and the
usage a reply shows under each usage style (`reported_usage`, `streamed_usage`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass


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
    # "anthropic" envelope | "raw" (below) | "empty" | "stop_reason"
    body: str = "anthropic"
    raw: dict | None = None        # the whole body, for endpoints that answer OpenAI-style

    def text(self, n: int, m: int, w: int) -> str:
        return self.message.format(n=n, m=m, t=n + m, w=w)


OVERFLOWS = {
    "anthropic": Overflow(400, "invalid_request_error",
                          "prompt is too long: {n} tokens > {w} maximum", False),
    # older Anthropic models weigh the prompt together with the output it may need
    "anthropic_max_tokens": Overflow(
        400, "invalid_request_error",
        "input length and `max_tokens` exceed context limit: {n} + {m} > {w}, "
        "decrease input length or `max_tokens` and try again", True),
    # Cloudflare in front of the API refuses an oversized body before the API sees it
    "413": Overflow(413, "request_too_large",
                    "Request exceeds the maximum allowed number of bytes.", False),
    "413_empty": Overflow(413, None, "", False, body="empty"),
    # DeepSeek and OpenRouter pass on OpenAI's wording
    "openai": Overflow(
        400, "invalid_request_error",
        "This model's maximum context length is {w} tokens. However, you requested {t} tokens "
        "({n} in the messages, {m} in the completion). "
        "Please reduce the length of the messages or completion.",
        True),
    "vllm": Overflow(400, "invalid_request_error",
                     "The input ({n} tokens) is longer than the model's context length "
                     "({w} tokens).", False),
    "llamacpp": Overflow(400, "exceed_context_size_error",
                         "the request exceeds the available context size, try increasing it", True),
    "kimi": Overflow(400, "invalid_request_error",
                     "Invalid request: Your request exceeded model token limit: "
                     "{w} (requested: {t})", True),
    # MiniMax's code 2013 is reused for other invalid parameters, so the text alone is ambiguous
    "minimax": Overflow(400, "invalid_request_error",
                        "invalid params, context window exceeds limit (2013)", True),
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
        "litellm.ContextWindowExceededError: litellm.BadRequestError: "
        "ContextWindowExceededError: prompt too long for model", False, body="raw",
        raw={"error": {"message": "litellm.ContextWindowExceededError: litellm.BadRequestError: "
                                  "ContextWindowExceededError: prompt too long for model",
                       "type": None, "param": None, "code": "400"}}),
    # LiteLLM relaying llama-cpp-python: streamed, the failure inside the server becomes an
    # empty 200 (body "silent"); not streamed, llama-cpp-python's words come through, wrapped
    "litellm_llamacpp": Overflow(
        400, "invalid_request_error",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: "
        "ContextWindowExceededError: OpenAIException - "
        "This model's maximum context length is {w} tokens. "
        "However, you requested {t} tokens ({n} in the messages, {m} in the completion). "
        "Please reduce the length of the messages or completion.\n"
        "model=smollm. context_window_fallbacks=None. fallbacks=None.\n\n"
        "Set 'context_window_fallback' - https://docs.litellm.ai/docs/routing#fallbacks\n\n"
        "LiteLLM: model group 'smollm' failed with the error above. No fallback was attempted.",
        False, body="silent"),
    # LiteLLM with model_info.max_input_tokens and enable_pre_call_checks refuses before the call
    "litellm_precall": Overflow(
        400, "invalid_request_error",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: "
        "litellm._pre_call_checks: Context Window exceeded for given call. "
        "No models have context window large enough for this call.\n"
        "Model=openai/smollm, Max Input Tokens={w}, Got={n}\n"
        "model=smollm. context_window_fallbacks=None. fallbacks=None.\n\n"
        "Set 'context_window_fallback' - https://docs.litellm.ai/docs/routing#fallbacks\n\n"
        "LiteLLM: model group 'smollm' failed with the error above. No fallback was attempted.",
        False),
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
    "kimi": dict(overflow="kimi", models_api=False, count_tokens_api=False,
                 usage="includes_cache", tool_ids="kimi"),
    # GLM (z.ai): a 200 with stop_reason model_context_window_exceeded; no Models API or
    # count_tokens; message_start reports input_tokens 0, the figures come in message_delta.
    "glm": dict(overflow="stop_reason", models_api=False, count_tokens_api=False,
                usage="zero_start"),
    # MiniMax: "context window exceeds limit (2013)", counting max_tokens; no Models API or
    # count_tokens; message_delta may come without usage.
    "minimax": dict(overflow="minimax", models_api=False, count_tokens_api=False,
                    usage="no_delta_usage"),
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
    "litellm_llamacpp": dict(overflow="litellm_llamacpp", system_format="string",
                             tool_stream="pieces", usage="zero_start", count_tokens_api=False,
                             auth="litellm", template="strings"),
}

THINKING_KEY = b"fake-anthropic-thinking"  # fixed, so a signature stays valid across fake servers


def sign_thinking(thinking: str) -> str:
    """The signature the fake gives a thinking text; any change to the text breaks it."""
    digest = hmac.new(THINKING_KEY, thinking.encode("utf-8", "surrogatepass"),
                      hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def reported_usage(style: str, usage: dict) -> dict | None:
    """The usage a reply shows under a usage style (`usage_log` keeps the true figures)."""
    if style == "none":
        return None
    if style == "includes_cache":  # Kimi: cache reads are inside input_tokens, not beside them
        return dict(usage, input_tokens=usage.get("input_tokens", 0)
                    + usage.get("cache_read_input_tokens", 0))
    return dict(usage)


def streamed_usage(style: str, usage: dict) -> tuple[dict | None, dict | None]:
    """The usage of message_start and of message_delta under a usage style.

    None means `"usage": null` in message_start, and no usage key in message_delta."""
    shown = reported_usage(style, usage)
    if shown is None:
        return None, None
    if style == "zero_start":  # GLM: zeros first, every real figure only at the end
        zeros = dict(shown, input_tokens=0, cache_read_input_tokens=0,
                     cache_creation_input_tokens=0, output_tokens=0)
        final = {key: shown.get(key, 0)
                 for key in ("input_tokens", "cache_read_input_tokens",
                             "cache_creation_input_tokens", "output_tokens")}
        return zeros, final
    start = dict(shown, output_tokens=1)
    if style == "no_delta_usage":  # MiniMax
        return start, None
    return start, {"output_tokens": shown["output_tokens"]}
