"""Token counting and the prompt cache of the fake Messages API: a deterministic stand-in
for the tokenizer (`count_tokens`, over the prompt's blocks in cache order from `prompt_blocks`),
and `PromptCache`, the API's prefix cache with its breakpoints, lookback, minimum sizes by
model (`minimum_cacheable`), TTLs and the settings that invalidate it (`message_settings`)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time

from .validation import _blocks

CACHE_LOOKBACK_BLOCKS = 20   # the API looks this many blocks back from a breakpoint for a hit
MIN_CACHEABLE_TOKENS = 1024  # shorter prefixes are not cached...
# ...except on these model families (prompt caching docs, "Cache limitations"): first match wins
MIN_CACHEABLE_BY_MODEL = [(r"opus-4-5|haiku-4-5", 4096), (r"haiku-3|3-haiku|3-5-haiku", 2048)]
CACHE_TTL_SECONDS = {"5m": 300, "1h": 3600}  # a read refreshes the entry for another TTL


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
        tokens = _piece_tokens(plain, chars_per_token) + (3 if n == 0 else 0) + \
            (4 if where in ("user", "assistant") else 0)
        key = where + json.dumps(plain, sort_keys=True)
        marked = block.get("cache_control")
        ttl = (marked.get("ttl") or "5m") if isinstance(marked, dict) else None
        blocks.append((key, tokens, ttl))
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
    return next((tokens for pattern, tokens in MIN_CACHEABLE_BY_MODEL
                 if re.search(pattern, model or "")),
                default)


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
            # the first message block: settings come before it
            if key.startswith("user") and settings:
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
        return {"input_tokens": total - read - long_written - short_written,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": long_written + short_written,
                "cache_creation": {"ephemeral_5m_input_tokens": short_written,
                                   "ephemeral_1h_input_tokens": long_written}}
