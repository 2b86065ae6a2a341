"""Recognising a context overflow, however the endpoint words it, and learning the
window from it.

Anthropic-compatible endpoints say "the prompt did not fit" in many wordings, under
different statuses, and some as a successful reply whose stop_reason is
"model_context_window_exceeded". One table decides them all. Machinery the chapter does
not need. It only reads what the endpoint said: context_overflow tells an overflow and the
sizes it names, learned_window the window to assume after it. Sending the request, and
raising ContextOverflow when it overflowed, is model_calls.py's job, beside it.
"""

import json
import re
from dataclasses import dataclass

MIN_CONTEXT_WINDOW = 4_000          # below this the system prompt and tools alone fill the window
# ten times the largest window offered; a count above it is no count
MAX_CONTEXT_WINDOW = 100_000_000
# an overflow that names no limit: assume this share of the rejected size
NO_NUMBERS_SHRINK = 0.8

# Named groups: n = the prompt's tokens, m = max_tokens, t = n + m, w = the window. The
# flag is True where the endpoint counts max_tokens against the window; None where the
# wording is shared by endpoints that count it (DeepSeek) and one that caps it instead
# (llama-cpp-python): it counts only when the prompt alone was within the window.
OVERFLOW_WORDINGS = [
    # Anthropic
    (r"prompt is too long: (?P<n>\d+) tokens > (?P<w>\d+) maximum", False),
    # Anthropic
    (r"input length and `max_tokens` exceed context limit: "
     r"(?P<n>\d+) \+ (?P<m>\d+) > (?P<w>\d+)", True),
    # DeepSeek, OpenRouter, llama-cpp-python
    (r"maximum context length is (?P<w>\d+) tokens\. However, you requested (?P<t>\d+) tokens"
     r"(?: \((?P<n>\d+) in the messages, (?P<m>\d+) in the completion\))?", None),
    # LiteLLM's pre-call check
    (r"Max Input Tokens=(?P<w>\d+), Got=(?P<n>\d+)", False),
    # vLLM
    (r"The input \((?P<n>\d+) tokens\) is longer than the model's context length "
     r"\((?P<w>\d+) tokens\)", False),
    # OpenAI-style, others
    (r"maximum context length is (?P<w>\d+) tokens"
     r"(?:\. However, your messages resulted in (?P<n>\d+) tokens)?", False),
    # Kimi
    (r"exceeded model token limit: (?P<w>\d+) \(requested: (?P<t>\d+)\)", True),
    # MiniMax (code 2013)
    (r"context window exceeds limit", True),
    # llama.cpp
    (r"request \((?P<n>\d+) tokens\) exceeds the available context size "
     r"\((?P<w>\d+) tokens\)", False),
    # llama.cpp, older
    (r"exceeds the available context size", False),
    # GLM (code 1261), others
    (r"prompt exceeds max length|prompt (is )?too long", False),
    # codes, LiteLLM, proxies
    (r"context_length_exceeded|ContextWindowExceeded|request_too_large"
     r"|exceeds? (the )?(model'?s? )?context (window|length)", False),
]


def is_token_count(value) -> bool:
    """Whether a number the endpoint sent can be a count of tokens: an int from 0 to
    MAX_CONTEXT_WINDOW. A bigger one (401 digits, say) would overflow the float arithmetic
    that sizes the window, and no prompt is that long; a string, a float or a bool is no
    count."""
    return (isinstance(value, int)
            and not isinstance(value, bool)
            and 0 <= value <= MAX_CONTEXT_WINDOW)


def stated_sizes(found: re.Match) -> dict:
    """The sizes an overflow message states, by group name; one no count can be is left out
    (int() would refuse 5,000 digits, and \\d takes digits of any script)."""
    sizes = {}
    for key, digits in found.groupdict().items():
        if digits and digits.isascii() and len(digits) <= len(str(MAX_CONTEXT_WINDOW)):
            sizes[key] = int(digits)
    return {key: size for key, size in sizes.items() if is_token_count(size)}


@dataclass(frozen=True)
class Overflow:
    """What the endpoint said when a prompt did not fit; a size is None when it did not say."""
    wording: str
    prompt_tokens: int | None = None
    window: int | None = None
    counts_output: bool = False


# LiteLLM relaying llama.cpp turns a prompt over the server's context size into a 200 with
# no content and no usage (replies.EmptyReply); when the request was larger than any
# answered, that is taken for an overflow that names no limit.
EMPTY_REPLY_OVERFLOW = Overflow(
    "an empty reply (no content, no usage) to a request larger than any answered")


class ContextOverflow(Exception):
    """A request refused (or cut off) because the prompt did not fit the endpoint's window."""

    def __init__(self, overflow: Overflow, sent_tokens: int, max_tokens: int):
        super().__init__(f"the context window overflowed ({overflow.wording})")
        self.overflow, self.sent_tokens, self.max_tokens = overflow, sent_tokens, max_tokens


def context_overflow(err: Exception | None = None, *, stop_reason: str | None = None,
                     max_tokens: int = 0) -> Overflow | None:
    """Whether an API error, or a successful reply's stop_reason, says the context overflowed."""
    if stop_reason == "model_context_window_exceeded":  # the input fit; input + max_tokens did not
        return Overflow("stop_reason model_context_window_exceeded", counts_output=True)
    if err is None:
        return None
    status, body = getattr(err, "status_code", None), getattr(err, "body", None)
    words = (json.dumps(body, ensure_ascii=False) if isinstance(body, (dict, list))
             else str(body or err))
    if status == 429 or "rate_limit" in words:
        return None  # "Too many tokens, please wait" is about speed, not size
    for pattern, counts_output in OVERFLOW_WORDINGS:
        found = re.search(pattern, words, re.IGNORECASE)
        if found:
            sizes = stated_sizes(found)
            prompt = sizes.get("n") or (sizes["t"] - max_tokens if "t" in sizes else None)
            prompt = prompt if prompt and prompt > 0 else None
            if counts_output is None:
                counts_output = bool(prompt and "w" in sizes and prompt <= sizes["w"])
            return Overflow(found.group(0)[:100], prompt, sizes.get("w"), counts_output)
    if status == 413:  # request_too_large, sometimes with no body at all
        return Overflow("413 request too large")
    return None


def learned_window(overflow: Overflow, *, window: int, sent_tokens: int, max_tokens: int,
                   largest_accepted: tuple) -> int:
    """The window to assume after an overflow: the one it states, else an estimate below
    the rejected request and no lower than the largest request the endpoint accepted.

    largest_accepted is (prompt tokens, prompt + max_tokens) of the biggest request that got
    a reply."""
    if overflow.window:  # a stated limit above ours means our estimate was low, not the window
        return max(MIN_CONTEXT_WINDOW, min(overflow.window, window))
    rejected = ((overflow.prompt_tokens or sent_tokens)
                + (max_tokens if overflow.counts_output else 0))
    accepted = largest_accepted[1] if overflow.counts_output else largest_accepted[0]
    if accepted >= rejected // 2:
        guess = accepted  # the refusal came after a small step: the limit is just above this
    elif accepted:
        guess = int((accepted * rejected) ** 0.5)  # after a big step: halfway, on a log scale
    else:
        guess = int(rejected * NO_NUMBERS_SHRINK)
    return max(MIN_CONTEXT_WINDOW, min(guess, int(rejected * 0.95), window))
