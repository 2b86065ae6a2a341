#!/usr/bin/env python3
"""s08: context compact. A coding agent that keeps working when its context fills up.

Before every model call the history goes through a pipeline, cheapest layer first:

    history ──▶ tool_result_budget   newest results too big?     → full text to disk, preview stays
            ──▶ snip_compact         over 50 messages, worth it? → middle messages to a transcript
            ──▶ micro_compact        past 70% of the threshold?  → old results become pointers
            ──▶ compact_history      still over the threshold?   → a summary, then what the work needs
            ──▶ model call ── "too long", in any endpoint's words ──▶ learn the window,
                                                                      reactive_compact, retry once

Nothing is thrown away: every layer writes what it removes to .task_outputs/tool-results/
or .transcripts/ before it removes it, and the session log keeps every message.

Run it from the folder you want the agent to work in (README.md has the rest):

    python s08_context_compact/code.py            # needs ANTHROPIC_API_KEY (or _AUTH_TOKEN) and MODEL_ID
    python s08_context_compact/code.py --demo     # watch every layer fire, offline, no key
"""


import argparse
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
import uuid
import warnings
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path



def lazy_import(name: str):
    """A module that loads the first time one of its names is used. The SDK takes a second
    or two to import, and --help, --list or a missing key need none of it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None  # not installed: main() says how to install it
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


anthropic = lazy_import("anthropic")  # the official SDK
httpx2 = lazy_import("httpx2")  # the SDK's HTTP library: its errors can surface while a stream is being read


# ==== PART 1: THE CHAPTER =========================================================================
# Read from here to agent_loop in the order the chapter README explains it. Part 2, the
# command line around it (REPL, session log, reading replies, configuration), starts below
# agent_loop. What earlier chapters built (the nine tools, hooks, the permission check)
# sits between the two.

# ---- settings, derived from the window -----------------------------------------------------------
# Sizes in tokens are derived from the context window (Settings.for_window); the numbers
# here are the chapter's defaults and the ceilings the derived values never exceed.
# the window and the threshold
DEFAULT_CONTEXT_WINDOW = 200_000    # tokens, when neither CONTEXT_WINDOW nor the Models API says
MIN_CONTEXT_WINDOW = 4_000          # below this the system prompt and tools alone fill the window
MAX_OUTPUT_TOKENS = 8_192           # asked for on every call, so reserved out of the window
AUTOCOMPACT_BUFFER_TOKENS = 13_000  # headroom for the estimate's error before the API's hard wall
COUNT_TOKENS_MARGIN = 0.1           # this close to the threshold, ask the API for the exact count
ESTIMATE_MARGIN = 0.85              # sizing by estimate alone, assume it may be 15% low
CHARS_PER_TOKEN = 4                 # for ASCII text; other characters count one token each
# tool_result_budget
TOOL_RESULT_BUDGET_CHARS = 200_000  # chapter: tool output allowed in one message
TOOL_RESULT_BUDGET_SHARE = 0.15     # ...and never more than this share of the usable context (a result
                                    # kept whole is soon cleared, and clearing rewrites the cache)
PREVIEW_CHARS = 2_000               # what stays in context of a result that went to disk
# snip_compact
SNIP_KEEP_HEAD = 3                  # the first request and its setup stay visible
SNIP_KEEP_TAIL = 47                 # current work; head + tail = 50 messages before snipping
SNIP_AT_LEAST = 20                  # a snip rewrites the cache after the head: make it worth it...
SNIP_FREES_AT_LEAST_SHARE = 0.25    # ...by cutting at least 20 messages and this share of the threshold
# micro_compact
KEEP_RECENT_TOOL_RESULTS = 3        # micro_compact leaves the newest results alone
MICRO_COMPACT_MIN_CHARS = 120       # a placeholder is no shorter than this, so skip smaller results
MICRO_TRIGGER_SHARE = 0.7           # micro_compact acts only above this share of the threshold...
CACHE_LIFETIME_SECONDS = 300       # the API's prompt cache forgets a prefix unread this long (CACHE_TTL=1h: an hour)...
COLD_TRIGGER_SHARE = 0.5            # ...so after such a gap snip and micro act from this share, freely
CLEAR_AT_LEAST_SHARE = 0.25          # ...and only if it frees at least this share (cache-aware)
PLACEHOLDER_TOKENS = 60             # a placeholder, long path included (over, not under)
# compact_history: the summary, its breaker, and what comes back after it
SUMMARY_MAX_TOKENS = 20_000         # ceiling for the summary's own output
SUMMARY_ATTEMPTS = 4                # "too long" retries, each dropping more of the oldest messages
MAX_CONSECUTIVE_SUMMARY_FAILURES = 3  # circuit breaker: stop paying for summaries that fail
POST_COMPACT_SHARE = 0.25           # the compacted context must come to less than this share
POST_COMPACT_MAX_FILES = 5          # after compaction, re-read the most recently read files:
POST_COMPACT_TOKENS_PER_FILE = 5_000  # at most this much of each...
POST_COMPACT_FILES_TOKENS = 50_000  # ...and this much in all
POST_COMPACT_USER_TOKENS = 5_000    # recent user messages restored verbatim, newest first
LEDGER_TOKENS = 2_000               # the fact ledger re-injected after compaction
CONSTRAINT_WORDS = re.compile(r"\b(must|mustn't|don't|do not|never|always)\b|必须|不要|不能|不许|禁止|务必|永远|总是",
                              re.IGNORECASE)  # a user line with one of these is a constraint
# reactive_compact
MAX_REACTIVE_RETRIES = 1            # per turn; a second "too long" is reported, not looped on
REACTIVE_TAIL_SHARE = 0.25          # reactive_compact keeps recent messages up to this share
NO_NUMBERS_SHRINK = 0.8             # an overflow that names no limit: assume this share of the rejected size
# what the layers write, and how the program marks its own blocks
TRANSCRIPT_DIR = ".transcripts"
TOOL_RESULTS_DIR = ".task_outputs/tool-results"
COMPACT_MARKER = "[Compacted"       # text our own messages start with, so they are
SNIP_MARKER = "[Snipped"            # never mistaken for the user's request
REACTIVE_MARKER = "[Reactive compact"
RESTORED_MARKER = "[Restored after compaction"
NOTE_MARKER = "[Program note"
PERSISTED_TAG = "<persisted-output"
PLACEHOLDER_PREFIX = "[Earlier tool result"
# The program knows its own blocks by a field, never by their text: a user may type any of
# the texts above. The field (and its companions) is stripped from every request.
OWN = "_s08"                        # on a block the program wrote: its kind ("snip", "placeholder", ...)
PROGRAM_FIELDS = (OWN, "snipped", "saved_at")
# the loop and the tools (earlier chapters)
MAX_STEPS_PER_TURN = 100            # model calls in one user turn before we stop and ask
SUBAGENT_MAX_STEPS = 30
MAX_API_ATTEMPTS = 4                # a call and up to 3 retries for 429, 5xx and dropped connections
RETRY_BASE_SECONDS = 1.0            # backoff 1 s, 2 s, 4 s (±20%), unless the API says when
CONNECT_TIMEOUT = 10.0              # seconds to reach the endpoint (API_CONNECT_TIMEOUT)
IDLE_TIMEOUT = 120.0                # a stream silent this long (pings aside) is abandoned (API_IDLE_TIMEOUT)
BASH_TIMEOUT = 120                  # seconds, unless the call asks for another (max 600)
BASH_OUTPUT_HEAD = 200_000          # characters of command output kept in memory...
BASH_OUTPUT_TAIL = 20_000           # ...plus the last ones, so errors at the end survive
READ_DEFAULT_LINES = 2_000
READ_MAX_CHARS = 200_000            # one read_file call returns at most this much
READ_MAX_LINE_CHARS = 2_000         # minified files: cut single lines, not whole reads
EDIT_MAX_BYTES = 10_000_000         # edit_file loads the whole file: refuse bigger ones
GLOB_MAX_RESULTS = 200


@dataclass(frozen=True)
class Settings:
    """Every "too big" threshold, derived from one number: the context window in tokens."""
    model: str
    window: int
    max_output: int
    threshold: int              # auto-compact above this: window − max output − buffer
    budget_chars: int           # tool_result_budget per message
    preview_chars: int
    summary_max_tokens: int
    micro_trigger: int          # micro_compact acts above this many tokens...
    clear_at_least: int         # ...and frees at least this many, or does nothing
    compacted_max: int          # tokens the compacted context must stay under
    restore_file_tokens: int    # per re-read file after compaction
    restore_files_tokens: int   # all re-read files together
    restore_user_tokens: int    # recent user messages restored
    ledger_tokens: int          # the fact ledger re-injected
    snip_min_tokens: int        # snip_compact cuts only if it frees this many
    keep_recent: int            # micro_compact leaves this many newest results alone
    snip_keep_head: int = SNIP_KEEP_HEAD
    snip_keep_tail: int = SNIP_KEEP_TAIL
    snip_at_least: int = SNIP_AT_LEAST
    micro_min_chars: int = MICRO_COMPACT_MIN_CHARS
    retry_base_seconds: float = RETRY_BASE_SECONDS
    idle_timeout: float = IDLE_TIMEOUT  # seconds a stream may send nothing new before it is abandoned
    cache_ttl: str = "5m"       # the prompt cache's life: "5m", or "1h" (writes cost 2× instead of 1.25×)

    @classmethod
    def for_window(cls, model: str, window: int) -> "Settings":
        max_output = min(MAX_OUTPUT_TOKENS, window // 4)
        buffer = min(AUTOCOMPACT_BUFFER_TOKENS, window // 10)
        threshold = window - max_output - buffer
        budget = min(TOOL_RESULT_BUDGET_CHARS, int(threshold * TOOL_RESULT_BUDGET_SHARE * CHARS_PER_TOKEN))
        return cls(model=model, window=window, max_output=max_output, threshold=threshold,
                   budget_chars=budget, preview_chars=min(PREVIEW_CHARS, budget // 8),
                   summary_max_tokens=min(SUMMARY_MAX_TOKENS, max_output),
                   micro_trigger=int(threshold * MICRO_TRIGGER_SHARE),
                   clear_at_least=int(threshold * CLEAR_AT_LEAST_SHARE),
                   snip_min_tokens=int(threshold * SNIP_FREES_AT_LEAST_SHARE),
                   # at a small window a kept result is a big share, re-sent after every clearing
                   keep_recent=max(1, min(KEEP_RECENT_TOOL_RESULTS, window // 50_000)),
                   compacted_max=int(window * POST_COMPACT_SHARE),
                   # what comes back after a summary shares that quarter of the window
                   restore_file_tokens=min(POST_COMPACT_TOKENS_PER_FILE, window // 40),
                   restore_files_tokens=min(POST_COMPACT_FILES_TOKENS, window // 8),
                   restore_user_tokens=min(POST_COMPACT_USER_TOKENS, window // 40),
                   ledger_tokens=min(LEDGER_TOKENS, window // 100))


    def resized(self, window: int) -> "Settings":
        """The same settings for another window (one the endpoint revealed), overrides kept."""
        if window == self.window:
            return self
        overrides = {f.name: getattr(self, f.name) for f in fields(self) if f.default is not MISSING}
        return replace(Settings.for_window(self.model, window), **overrides)


# ---- the history, as plain dicts -----------------------------------------------------------------
# History is a list of plain dicts in the API's wire format. These helpers read it.

def blocks_of(message: dict) -> list:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def has_tool_use(message: dict) -> bool:
    return message["role"] == "assistant" and any(b.get("type") == "tool_use" for b in blocks_of(message))


def is_tool_result_message(message: dict) -> bool:
    return message["role"] == "user" and any(b.get("type") == "tool_result" for b in blocks_of(message))


def result_text(block: dict) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content if part.get("type") == "text")


def own_text(kind: str, text: str, **fields) -> dict:
    """A text block the program wrote (a summary header, a marker, a note)."""
    return {"type": "text", "text": text, OWN: kind, **fields}


def sendable(message: dict) -> dict:
    """The message as the API takes it: the program's own fields off its blocks."""
    content = blocks_of(message)
    if not any(OWN in block for block in content):
        return message
    return {**message, "content": [{k: v for k, v in b.items() if k not in PROGRAM_FIELDS} for b in content]}


def is_request_block(block: dict) -> bool:
    return block.get("type") == "text" and OWN not in block


def current_request(messages: list) -> dict | None:
    """The newest text block the user typed (our own markers are not requests)."""
    for message in reversed(messages):
        if message["role"] == "user":
            for block in reversed(blocks_of(message)):
                if is_request_block(block):
                    return {"type": "text", "text": block["text"]}
    return None


def last_reply_text(messages: list) -> str:
    """The model's newest text (a text block of the newest assistant message that has one)."""
    return next((b["text"] for m in reversed(messages) if m["role"] == "assistant"
                 for b in reversed(blocks_of(m)) if b.get("type") == "text"), "")


def user_words(messages: list) -> list:
    """Every text block the user typed, oldest first (our own markers left out)."""
    return [b["text"] for m in messages if m["role"] == "user" for b in blocks_of(m) if is_request_block(b)]


def still_in_context(messages: list, tool_use_id: str) -> bool:
    """Whether a tool result is still in the history with its full text (not cleared or previewed)."""
    for message in messages:
        for block in blocks_of(message):
            if block.get("type") == "tool_result" and block["tool_use_id"] == tool_use_id:
                return OWN not in block  # not a placeholder, not a preview
    return False


def tool_names(messages: list) -> dict:
    return {b["id"]: b["name"] for m in messages if m["role"] == "assistant"
            for b in blocks_of(m) if b.get("type") == "tool_use"}


def with_text(message: dict, *texts) -> dict:
    """A copy of a user message with text blocks (or strings) appended after its tool results."""
    return {**message, "content": blocks_of(message) + [t if isinstance(t, dict) else {"type": "text", "text": t}
                                                        for t in texts]}


def group_starts(messages: list) -> list:
    """Indexes where the history may be cut: each assistant message starts a group with its results."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def message_groups(messages: list) -> list:
    """The history from its first assistant message on, as groups: a call and its results
    (and any user words after them) travel together."""
    starts = group_starts(messages)
    return [messages[start:end] for start, end in zip(starts, starts[1:] + [len(messages)])]


# ---- counting tokens -----------------------------------------------------------------------------
# Layers copy what they change and never edit a message in place: the TokenCounter
# knows unchanged messages by identity, so only what is new is estimated.

def estimate_text_tokens(text: str) -> int:
    ascii_chars = len(text.encode("ascii", "ignore"))
    return ascii_chars // CHARS_PER_TOKEN + (len(text) - ascii_chars) + 1


def estimate_tokens(messages: list) -> int:
    """A character-based estimate of what is sent: ASCII at 4 characters a token, anything
    else one each."""
    return sum(estimate_text_tokens(json.dumps(sendable(m), ensure_ascii=False)) for m in messages)


def newest_within(items: list, max_tokens: int, size) -> list:
    """The newest items that together cost at most max_tokens, in their order. Used wherever
    recent things are kept and older ones let go: recent groups, user messages, ledger lines."""
    kept, used = [], 0
    for item in reversed(items):
        used += size(item)
        if used > max_tokens:
            break
        kept.append(item)
    return kept[::-1]


def head_within(text: str, max_tokens: int) -> str:
    """The start of text that costs at most max_tokens: four characters a token in ASCII,
    one in Chinese. Cut by a quarter at a time, so long texts need few measurements."""
    head = text[:max_tokens * CHARS_PER_TOKEN]
    while head and estimate_text_tokens(head) > max_tokens + 1:  # the estimate adds 1 to any text
        head = head[:len(head) * 3 // 4]
    return head


class TokenCounter:
    """The context's size, anchored to the API: the last response's usage is exact, and
    only messages added or changed since are estimated."""

    def __init__(self):
        self.sizes = {}              # id(message) -> (message, estimate): each message measured once
        self.anchor_tokens = None
        self.anchor_messages = []

    def size(self, message: dict) -> int:
        entry = self.sizes.get(id(message))
        if entry is None or entry[0] is not message:
            entry = self.sizes[id(message)] = (message, estimate_tokens([message]))
        return entry[1]

    def estimate(self, messages: list) -> int:
        return sum(self.size(m) for m in messages)

    def anchor(self, tokens: int, messages: list) -> None:
        self.anchor_tokens, self.anchor_messages = tokens, list(messages)
        if len(self.sizes) > 4 * len(messages) + 100:  # forget messages no longer in history
            self.sizes = {id(m): (m, self.size(m)) for m in messages}

    def count(self, messages: list, overhead: int) -> int:
        if self.anchor_tokens is None:
            return overhead + self.estimate(messages)
        same = len(self.anchor_messages)
        # The usual cases, the anchored history as it was or with new messages after it, are
        # decided by one list comparison: in C, identical items by identity, no message read.
        if (messages if len(messages) == same else messages[:same]) != self.anchor_messages:
            same = 0  # layers copy only what they change, so identity marks what is unchanged
            for old, new in zip(self.anchor_messages, messages):
                if old is not new:
                    break
                same += 1
        before, after = self.anchor_messages[same:], messages[same:]
        if before and after:  # something was rewritten: compare what is gone with what is new
            now = {id(m) for m in after}
            gone = [m for m in before if id(m) not in now]
            if same == 0 and len(gone) == len(before):  # nothing in common (a summary): the anchor says nothing
                return overhead + self.estimate(messages)
            then = {id(m) for m in before}
            before, after = gone, [m for m in after if id(m) not in then]
        return self.anchor_tokens - self.estimate(before) + self.estimate(after)


def context_tokens(agent, messages: list) -> int:
    """Tokens the next request will carry: exact up to the last response, estimated after."""
    return agent.state.tokens.count(messages, agent.overhead)


def exact_context_tokens(agent, messages: list) -> int:
    """Ask count_tokens when the endpoint offers it; otherwise fall back to the estimate."""
    estimate = context_tokens(agent, messages)
    if agent.endpoint.can_count_tokens:
        request = build_request(agent, messages)
        request.pop("max_tokens")
        try:
            counted = agent.client.messages.count_tokens(**request).input_tokens
        except anthropic.APIStatusError as err:
            # 404 (or 405, 501): not offered here, so never ask again; anything else: not this time
            agent.endpoint.can_count_tokens = err.status_code not in (404, 405, 501)
            counted = None
        except anthropic.APIError:
            counted = None
        if isinstance(counted, int) and counted >= estimate / 2:
            agent.state.tokens.anchor(counted, messages)
            return counted
        if counted is not None:
            agent.endpoint.can_count_tokens = False  # a count far below what is sent is not a count of it
    return estimate


def over_threshold(agent, messages: list) -> bool:
    """Compare with the threshold; near it, an exact count decides rather than an estimate."""
    s = agent.settings
    tokens = context_tokens(agent, messages)
    if abs(tokens - s.threshold) <= s.threshold * COUNT_TOKENS_MARGIN:
        tokens = exact_context_tokens(agent, messages)
    return tokens > s.threshold


# ---- saving before removing ----------------------------------------------------------------------
# The only writes the layers cause. Files are opened with "x" (create, never replace)
# under names that are new each time, so nothing is ever overwritten.

def output_names(folder: Path, tool_use_id: str):
    """Where a tool call's output may go: <id>.txt, then <id>-1.txt, ... (a bounded number)."""
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", tool_use_id)[:80] or "result"
    for attempt in range(1000):
        yield folder / (f"{stem}.txt" if attempt == 0 else f"{stem}-{attempt}.txt")


def save_tool_output(folder: Path, tool_use_id: str, text: str) -> Path:
    """Write one full tool result, byte for byte, and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8", "surrogatepass")
    for path in output_names(folder, tool_use_id):
        if path.exists() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return path  # the same content saved before: point at it again
        try:
            with open(path, "xb") as f:
                f.write(data)
            return path
        except FileExistsError:
            continue
    raise OSError(f"could not find a free file name for {tool_use_id} in {folder}")


def save_transcript(folder: Path, messages: list, kind: str) -> Path:
    """Write messages as JSON lines, one message a line, and return the path."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"{kind}-{stamp}-{uuid.uuid4().hex[:8]}.jsonl"
    with open(path, "x", encoding="utf-8") as f:
        for message in messages:
            f.write(json.dumps(message, ensure_ascii=False) + "\n")
    return path


class Store:
    """Where the layers put what they remove, in the workspace: full tool outputs, and
    removed messages as transcripts. The history is redacted where content enters it; this
    is the last net before the disk. It keeps a list of what it wrote, for the reports."""

    def __init__(self, workdir: Path, secrets: list = ()):
        self.workdir, self.secrets, self.written = workdir, list(secrets), []

    def save_output(self, tool_use_id: str, text: str) -> Path:
        return self.wrote(save_tool_output(self.workdir / TOOL_RESULTS_DIR, tool_use_id, redact(text, self.secrets)))

    def save_messages(self, messages: list, kind: str) -> Path:
        return self.wrote(save_transcript(self.workdir / TRANSCRIPT_DIR, redact_deep(messages, self.secrets), kind))

    def wrote(self, path: Path) -> Path:
        self.written.append(path.relative_to(self.workdir))
        return self.written[-1]


# ---- the compaction layers -----------------------------------------------------------------------
# Each takes the history and returns it, changed or not; what it removes it first saves
# through the store it is handed.

def persisted_preview(path: Path, text: str, preview_chars: int) -> str:
    # Fixed wording, so clearing the same content twice produces the same bytes.
    head = head_within(text, preview_chars // CHARS_PER_TOKEN)
    return (f"{PERSISTED_TAG} path=\"{path}\" chars=\"{len(text)}\">\n"
            f"This result was too large to keep in context. The full output is saved at {path}; "
            f"read it (read_file with offset/limit) if you need more than this preview.\n"
            f"Preview (first {len(head)} characters):\n{head}\n</persisted-output>")


def replace_result(block: dict, content: str, kind: str | None = None, saved_at: str | None = None) -> dict:
    """A copy of a tool result with new content; kind and saved_at mark a preview or a placeholder."""
    marks = {OWN: kind, **({"saved_at": str(saved_at)} if saved_at else {})} if kind else {}
    return {**block, "content": content, **marks}


def fewer_tokens(new: str, old: str) -> bool:
    """Whether a replacement costs fewer tokens than the text it replaces, measured as it
    stands in a request (inside JSON). A layer replaces nothing otherwise: it must never grow."""
    return estimate_text_tokens(json.dumps(new, ensure_ascii=False)) < \
        estimate_text_tokens(json.dumps(old, ensure_ascii=False))


def previewed(block: dict, preview_chars: int, store) -> dict:
    """A tool result saved to disk and replaced by a preview, when the preview is the smaller."""
    text = result_text(block)
    if estimate_text_tokens(text) <= preview_chars // CHARS_PER_TOKEN or OWN in block:
        return block
    path = store.save_output(block["tool_use_id"], text)
    preview = persisted_preview(path, text, preview_chars)
    return replace_result(block, preview, "preview", path) if fewer_tokens(preview, text) else block


def preview_results(message: dict, preview_chars: int, store) -> dict:
    """Persist every result in a message that is longer than a preview, keeping the preview."""
    return {**message, "content": [previewed(b, preview_chars, store) if b.get("type") == "tool_result"
                                   else b for b in blocks_of(message)]}


def tool_result_budget(messages: list, *, max_chars: int, preview_chars: int, store) -> list:
    """Keep the newest message's tool results under max_chars; the largest go to disk first."""
    if not messages or not is_tool_result_message(messages[-1]):
        return messages
    last = messages[-1]
    blocks = list(blocks_of(last))
    sizes = {k: len(result_text(b)) for k, b in enumerate(blocks) if b.get("type") == "tool_result"}
    total = sum(sizes.values())
    if total <= max_chars:
        return messages
    for k in sorted(sizes, key=sizes.get, reverse=True):
        if total > max_chars:
            blocks[k] = previewed(blocks[k], preview_chars, store)
            total -= sizes[k] - len(result_text(blocks[k]))
    if all(new is old for new, old in zip(blocks, blocks_of(last))):
        return messages
    return messages[:-1] + [{**last, "content": blocks}]


def snip_compact(messages: list, *, keep_head: int, keep_tail: int, at_least: int, min_tokens: int = 0,
                 store, measure=estimate_tokens) -> list:
    """Drop the middle of a long history, never splitting a tool_use from its tool_result."""
    if len(messages) <= keep_head + keep_tail:
        return messages
    # Every snip changes the head, so the cache is rewritten after it: cut at least
    # `at_least` messages at once, and the next snip is that many messages away.
    keep_tail = max(1, min(keep_tail, len(messages) - keep_head - at_least))
    starts = group_starts(messages)
    # The head ends just before an assistant message, the tail begins with one: both
    # cut points fall between a tool_result message and the next call, never inside a pair.
    head_end = next((i for i in starts if i >= keep_head), None)
    tail_start = next((i for i in reversed(starts) if i <= len(messages) - keep_tail), None)
    if head_end is None or tail_start is None or tail_start <= head_end:
        return messages
    removed = messages[head_end:tail_start]
    if measure(removed) < min_tokens:
        return messages  # too little to pay for rewriting the cache after the head
    path = store.save_messages(removed, "snip")
    head_last = messages[head_end - 1]
    earlier = sum(b.get("snipped", 0) for b in blocks_of(head_last) if b.get(OWN) == "snip")  # one marker, folded
    kept_blocks = [b for b in blocks_of(head_last) if b.get(OWN) != "snip"]
    snipped = earlier + len(removed)
    texts = [own_text("snip", f"{SNIP_MARKER} {snipped} messages from the middle of the conversation; "
                              f"the latest ones are saved in {path}.{what_was_done(removed)}]", snipped=snipped)]
    request = current_request(messages)
    if request and current_request(messages[:head_end] + messages[tail_start:]) != request:
        texts.append(request["text"])  # the user's current request stays visible verbatim
    new_head_last = with_text({**head_last, "content": kept_blocks}, *texts)
    result = messages[:head_end - 1] + [new_head_last] + messages[tail_start:]
    return result if measure(result) < measure(messages) else messages


def what_was_done(removed: list) -> str:
    """A few lines on what the snipped messages did, so the model knows what it no longer
    sees: the files read and written, the commands run and how they ended."""
    outcome = {b["tool_use_id"]: re.search(r"\[exit code (\d+)\]|\[timed out", result_text(b))
               for m in removed for b in blocks_of(m) if b.get("type") == "tool_result"}
    done = {"read": [], "wrote": [], "ran": []}
    for message in removed:
        for call in [b for b in blocks_of(message) if b.get("type") == "tool_use" and isinstance(b.get("input"), dict)]:
            path, command, ended = call["input"].get("path"), call["input"].get("command"), outcome.get(call["id"])
            if call["name"] == "read_file" and isinstance(path, str):
                done["read"].append(path)
            elif call["name"] in ("write_file", "edit_file") and isinstance(path, str):
                done["wrote"].append(path)
            elif call["name"] == "bash" and isinstance(command, str):
                code = "timed out" if ended and not ended.group(1) else f"exit {ended.group(1) if ended else 0}"
                done["ran"].append(f"`{one_line(command, 60)}` ({code})")
    lines = []
    for kind, items in done.items():
        unique = list(dict.fromkeys(items))
        if unique:
            lines.append(f"\n{kind}: " + (f"{len(unique) - 8} more, then " if len(unique) > 8 else "")
                         + ", ".join(unique[-8:]))
    return " What they did:" + "".join(lines) if lines else ""


def micro_compact(messages: list, *, keep_recent: int, min_chars: int, clear_at_least: int, store) -> list:
    """Replace all but the newest tool results with a pointer to their saved copy."""
    positions = [(i, k) for i, m in enumerate(messages) if is_tool_result_message(m)
                 for k, b in enumerate(blocks_of(m)) if b.get("type") == "tool_result"]
    protected = set(positions[-keep_recent:]) if keep_recent else set()
    if messages and is_tool_result_message(messages[-1]):
        # results in the last message have not been seen by the model yet
        protected |= {(i, k) for i, k in positions if i == len(messages) - 1}
    stale = [(i, k) for i, k in positions if (i, k) not in protected
             and len(result_text(blocks_of(messages[i])[k])) > min_chars
             and blocks_of(messages[i])[k].get(OWN) != "placeholder"]
    # Clearing rewrites the cache from the first cleared result on; below the minimum
    # the rewrite costs more than the tokens it frees, so clear nothing.
    freed = sum(estimate_text_tokens(result_text(blocks_of(messages[i])[k])) - PLACEHOLDER_TOKENS for i, k in stale)
    if not stale or freed < clear_at_least:
        return messages
    names = tool_names(messages)
    changed = {}
    for i, k in stale:
        block = blocks_of(changed.get(i, messages[i]))[k]
        text = result_text(block)
        path = block.get("saved_at") if block.get(OWN) == "preview" else store.save_output(block["tool_use_id"], text)
        placeholder = (f"{PLACEHOLDER_PREFIX} ({names.get(block['tool_use_id'], 'tool')}) cleared to save "
                       f"context. Full output: {path}. Read that file if you need it again.]")
        if not fewer_tokens(placeholder, text):
            continue  # a long path can make the pointer cost more than a short result
        blocks = list(blocks_of(changed.get(i, messages[i])))
        blocks[k] = replace_result(block, placeholder, "placeholder", path)
        changed[i] = {**messages[i], "content": blocks}
    return [changed.get(i, m) for i, m in enumerate(messages)] if changed else messages


def compact_history(messages: list, *, summary: str, restored: list, preview_chars: int, store) -> list:
    """Replace the history with a summary, then what the work needs back, then the request.
    In the middle of a turn the last call and its results stay, so the model carries on."""
    mid_turn = len(messages) >= 2 and is_tool_result_message(messages[-1])
    return replace_with_summary(messages, "compact", summary, messages[-2:] if mid_turn else [], restored,
                                preview_chars, store)


def reactive_compact(messages: list, *, summary: str, restored: list, preview_chars: int, store,
                     tail_tokens: int) -> list:
    """After "prompt is too long": the same, keeping only the recent groups that fit in tail_tokens."""
    groups = message_groups(messages)
    kept = newest_within(groups, tail_tokens, estimate_tokens) or groups[-1:]  # the newest group stays, whole
    return replace_with_summary(messages, "reactive", summary, [m for group in kept for m in group], restored,
                                preview_chars, store)


def replace_with_summary(messages: list, kind: str, summary: str, tail: list, restored: list,
                         preview_chars: int, store) -> list:
    """Both summary layers: save the whole history, then one user message with the summary,
    the restored context and, last, the request being worked on; then the tail, its big
    results saved and previewed."""
    path = store.save_messages(messages, kind)
    marker = REACTIVE_MARKER if kind == "reactive" else COMPACT_MARKER
    header = (f"{marker}: the earlier conversation was summarized to free context. "
              f"The full transcript is saved at {path}.]\n\n{summary}")
    first = {"role": "user", "content": [own_text(kind, header)] + [own_text("restored", t) for t in restored]}
    tail = [preview_results(m, preview_chars, store) if m["role"] == "user" else m for m in tail]
    request = current_request(messages)
    in_flight = messages and messages[-1]["role"] == "user"  # a finished turn has no pending request
    if request and in_flight and current_request(tail) != request:
        first["content"].append(request)
    result = [first] + tail
    # Every layer hands back a history no larger than it got: a summary of a history that is
    # already short (a summary and little else) would only add its header and restored files.
    return result if estimate_tokens(result) < estimate_tokens(messages) else messages


# ---- the summary ---------------------------------------------------------------------------------
# One model call, guarded at both ends; a breaker after repeated failures, and a summary
# built without the model so compaction succeeds in every case.

SUMMARY_INSTRUCTIONS = """TEXT ONLY, NO TOOLS. Do not call any tool in this answer: this turn only writes a
summary, and a tool call here would be lost.

The conversation above is about to be replaced by the summary you write now. The work will
continue from your summary alone, so leave out nothing that matters and nothing vague.

First think inside <analysis></analysis>: go through the conversation in order and note
what the user asked each time, what was done, which files and code were involved, what
went wrong and how it was fixed, and what was still open at the end.

Then write the summary inside <summary></summary>, with these numbered sections:
1. Primary request and intent: everything the user asked for, in detail.
2. Key technical concepts: the technologies, libraries and conventions that matter.
3. Files and code sections: each file read, changed or created, why it matters, and the
   snippets that matter, verbatim.
4. Errors and fixes: each error met, how it was fixed, and what the user said about it.
5. Problem solving: what was solved, and what is still being worked out.
6. All user messages: every message the user wrote (not tool results), verbatim where short.
7. Pending tasks: what the user asked for that is not done yet.
8. Current work: exactly what was being done just before this summary, with file names
   and code.
9. Next step: only if it follows from the latest request (quote it); leave it out if the
   work was finished.
{extra}Only the <summary> is kept; the <analysis> is thrown away.

Reminder: answer with text only. Do not call any tools."""


class SummaryError(Exception):
    """The summary call failed, or returned nothing usable."""


def summary_instructions(focus: str, limit_tokens: int) -> str:
    extra = f"Focus especially on: {focus}\n" if focus else ""
    extra += f"Keep the <summary> under {limit_tokens:,} tokens (about {limit_tokens * 3 // 4:,} words).\n"
    return SUMMARY_INSTRUCTIONS.replace("{extra}", extra)


def extract_summary(text: str) -> str:
    text = re.sub(r"<analysis>.*?(</analysis>|$)", "", text, flags=re.S)
    match = re.search(r"<summary>(.*?)(</summary>|$)", text, re.S)
    return (match.group(1) if match else text).strip()


def cut_long_texts(message: dict, max_chars: int) -> dict:
    """A copy with every long text and tool result cut to max_chars (for a summary request only)."""
    def cut(text: str) -> str:
        return text if len(text) <= max_chars else text[:max_chars] + " [... cut to fit ...]"
    content = []
    for block in blocks_of(message):
        if block.get("type") == "text":
            block = {**block, "text": cut(block["text"])}
        elif block.get("type") == "tool_result":
            block = replace_result(block, cut(result_text(block)))
        content.append(block)
    return {**message, "content": content}


def fit_for_summary(messages: list, max_tokens: int) -> list:
    """The newest whole message groups that fit in max_tokens; tool pairs are never split."""
    if estimate_tokens(messages) <= max_tokens:
        return messages
    note = {"role": "user", "content": [{"type": "text", "text": "[The oldest messages were left out of "
                                         "this request to fit the window; they are in the transcript.]"}]}
    groups = message_groups(messages)
    kept = newest_within(groups, max_tokens - estimate_tokens([note]), estimate_tokens)
    if kept:
        return [note] + [m for group in kept for m in group]
    if not groups:  # not even the newest group fits: keep it, cut short
        return [cut_long_texts(messages[0], max_tokens)]
    return [note] + [cut_long_texts(m, max_tokens) for m in groups[-1]]


def summarize_with_model(agent, messages: list, focus: str, limit_tokens: int, undercount: float = 1.0) -> str:
    """One summary from the model (several calls only if it must drop old messages to fit).

    The request continues the cached conversation when it fits: same system, tools and
    messages, the instruction added at the end. tool_choice stays as the conversation has it
    (unset): the prompt caching docs list a changed tool_choice among what invalidates the
    cached messages, so the instruction alone forbids tools. undercount > 1 says
    the API counted that many times more tokens than we estimate. Raises SummaryError."""
    s = agent.settings
    instruction = summary_instructions(focus, limit_tokens)
    fixed = estimate_text_tokens(instruction) + s.summary_max_tokens
    budget = int((s.window - fixed - agent.overhead) / undercount * ESTIMATE_MARGIN)
    needed = context_tokens(agent, messages) * undercount + fixed
    if s.window * (1 - COUNT_TOKENS_MARGIN) < needed <= s.window:  # too close to call on an estimate
        needed = exact_context_tokens(agent, messages) * undercount + fixed
    fits = needed <= s.window
    sent = messages if fits else fit_for_summary(messages, budget)
    for _ in range(SUMMARY_ATTEMPTS):
        request = build_request(agent, sent, extra_text=instruction)
        request["max_tokens"] = s.summary_max_tokens
        try:
            answer = send_request(agent, request, agent.overhead + estimate_tokens(sent),
                                  label="writing the summary")
        except ContextOverflow as err:
            adopt_overflow(agent, err)
            # the error may say by how much we were over: leave out that much more
            over = err.overflow.prompt_tokens / err.overflow.window if err.overflow.window and \
                err.overflow.prompt_tokens else 2.0
            budget = int(min(budget, estimate_tokens(sent)) / max(over, 1.1) * 0.9)
            sent = fit_for_summary(messages, budget)
            continue
        except api_failures() as err:
            raise SummaryError(api_error_text(err)) from err
        return extract_summary("".join(b["text"] for b in answer.message["content"] if b["type"] == "text"))
    raise SummaryError("too long to summarize even after leaving out the oldest messages")


def fallback_summary(messages: list, todos: list, limit_tokens: int) -> str:
    """A summary assembled without the model, so compaction succeeds in every case."""
    said = user_words(messages)
    paths = [b["input"]["path"] for m in messages if m["role"] == "assistant" for b in blocks_of(m)
             if b.get("type") == "tool_use" and isinstance(b["input"].get("path"), str)]
    last = last_reply_text(messages)
    parts = ["(Assembled without the model, because the summary call failed: the user's messages, "
             "the files touched, the todo list and the last reply. The transcript has the rest.)",
             "User messages, oldest first:\n" + "\n".join(f"- {t[:500]}" for t in said[-20:]),
             "Files touched: " + (", ".join(dict.fromkeys(paths)) or "none")]
    if todos:
        parts.append("Todo list:\n" + render_todos(todos))
    if last:
        parts.append(f"The assistant's last reply:\n{last[:1500]}")
    return head_within("\n\n".join(parts), limit_tokens - 1)


def breaker_open(agent) -> bool:
    if agent.summary_failures < MAX_CONSECUTIVE_SUMMARY_FAILURES:
        return False
    if not agent.breaker_announced:
        agent.say(f"[summary] {MAX_CONSECUTIVE_SUMMARY_FAILURES} summaries failed in a row; no more summary "
                  "calls this session. Compaction goes on with summaries built without the model.")
        agent.breaker_announced = True
    return True


def make_summary(agent, messages: list, focus: str, limit: int, undercount: float = 1.0) -> tuple:
    """(a summary of at most `limit` tokens, who wrote it), in every case: the model's,
    else one built without it."""
    if not breaker_open(agent):
        try:
            summary = summarize_with_model(agent, messages, focus, limit, undercount)
            if not summary or estimate_text_tokens(summary) > limit:  # ask once more, for a shorter one
                summary = summarize_with_model(agent, messages, f"{focus} Your last answer was too long, empty, or "
                                               f"a tool call: write the summary as text, well under {limit:,} tokens."
                                               .strip(), limit, undercount)
            if not summary or estimate_text_tokens(summary) > limit:
                raise SummaryError("empty" if not summary else
                                   f"{estimate_text_tokens(summary):,} tokens, over the {limit:,} it must fit in")
            agent.summary_failures = 0
            return summary, "the model"
        except SummaryError as err:
            agent.summary_failures += 1
            agent.say(f"[summary] failed ({agent.summary_failures}/{MAX_CONSECUTIVE_SUMMARY_FAILURES}): {err}; "
                      "using one built without the model")
    return fallback_summary(messages, agent.state.todos, limit), "fallback"


# ---- what comes back after a summary -------------------------------------------------------------
# The fact ledger is what actually happened, recorded by hooks: it is put back after
# every compaction and checked against the summary.

def recent_user_messages(messages: list, max_tokens: int) -> str:
    """The user's own words, newest first and verbatim, up to max_tokens. A request still
    being worked on is left out: it comes last anyway (rebuild_after_summary)."""
    said = user_words(messages)
    in_flight = bool(messages) and messages[-1]["role"] == "user"
    kept = newest_within(said[:-1] if in_flight else said, max_tokens, estimate_text_tokens)[::-1]
    return f"{RESTORED_MARKER}: recent user messages, newest first]\n" + "\n".join(f"- {t}" for t in kept) \
        if kept else ""


def restored_files(agent, max_tokens: int) -> list:
    """The most recently read files, re-read from disk now; a changed or vanished file says so."""
    blocks, used = [], 0
    for path, (_, _, digest) in list(reversed(agent.ledger.reads.items()))[:POST_COMPACT_MAX_FILES]:
        target = inside_workspace(agent.workdir, path)
        if target is None or not target.is_file():
            blocks.append(f"{RESTORED_MARKER}: {path}] This file was read earlier and has since vanished.")
            continue
        room = min(agent.settings.restore_file_tokens, max_tokens - used)
        if room <= 50:
            continue
        with open(target, "rb") as f:
            raw = f.read(room * CHARS_PER_TOKEN)
        if b"\0" in raw[:8192]:
            continue
        text = head_within(redact(raw.decode("utf-8", "replace"), agent.secrets), room)  # a file may hold a key
        state = "unchanged since it was read" if short_hash(target) == digest else \
            "it CHANGED since it was last read; this is its content now"
        cut = "" if len(text.encode()) >= target.stat().st_size else "\n[... cut here; read_file shows the rest]"
        blocks.append(f"{RESTORED_MARKER}: {path}, re-read from disk, {state}]\n{text}{cut}")
        used += estimate_text_tokens(blocks[-1])
    return blocks


def plan_restore(agent, messages: list, tail_tokens: int) -> tuple:
    """What comes back after a summary, and how many tokens that leaves the summary.

    Everything together stays under compacted_max (a quarter of the window); at least a
    third of that is kept for the summary itself."""
    s = agent.settings
    request = current_request(messages)
    fixed = agent.overhead + tail_tokens + (estimate_text_tokens(request["text"]) if request else 0) + 100
    room = s.compacted_max - fixed - s.compacted_max // 3
    # RestoreContext hooks put back what they keep (the ledger does), within their share
    parts = [r["restore"] for r in fire_hooks(agent, "RestoreContext", max_tokens=min(s.ledger_tokens, max(room, 0)))
             if r.get("restore")]
    parts.append(recent_user_messages(messages, min(s.restore_user_tokens,
                                                    room - sum(map(estimate_text_tokens, parts)))))
    used = sum(estimate_text_tokens(p) for p in parts)
    parts += restored_files(agent, min(s.restore_files_tokens, room - used))
    if agent.state.todos:
        parts.append(f"{RESTORED_MARKER}: todo list]\n{render_todos(agent.state.todos)}")
    if agent.state.loaded_skills:
        parts.append(f"{RESTORED_MARKER}: skills loaded earlier] {', '.join(agent.state.loaded_skills)} "
                     "(call load_skill again to see their instructions)")
    restored = [p for p in parts if p]
    limit = s.compacted_max - fixed - sum(estimate_text_tokens(p) for p in restored)
    return restored, max(limit, s.window // 40)


def short_hash(path: Path) -> str:
    size = path.stat().st_size
    data = path.read_bytes() if size <= 8_000_000 else f"{size}:{path.stat().st_mtime_ns}".encode()
    return hashlib.sha1(data).hexdigest()[:8]


def summary_mentions(key: str, summary: str) -> bool:
    """Whether a summary still carries a fact: most of its words (or CJK characters) appear."""
    lowered = summary.lower()
    if " " not in key and ("/" in key or "::" in key):  # a path or test id: its last part is what counts
        return re.split(r"/|::", key)[-1].lower() in lowered
    parts = re.findall(r"[a-z0-9_.-]{3,}", key.lower()) + sorted(set(re.findall(r"[\u3040-\u9fff]", key)))
    return bool(parts) and sum(part in lowered for part in parts) >= 0.6 * len(parts)


class Ledger:
    """Files read and written, commands and exit codes, failing tests, and the user's constraints."""

    def __init__(self):
        self.reads = {}        # path -> (size, mtime_ns, hash), the most recent read last
        self.writes = {}       # path -> (size, hash)
        self.commands = []     # (command, exit code)
        self.failing = {}      # test ids seen failing, in order
        self.constraints = []  # the user's lines with must / never / 必须 ..., verbatim

    def note_read(self, path: str, target: Path) -> None:
        self.reads.pop(path, None)
        self.reads[path] = (target.stat().st_size, target.stat().st_mtime_ns, short_hash(target))

    def note_write(self, path: str, target: Path) -> None:
        self.writes[path] = (target.stat().st_size, short_hash(target))

    def note_command(self, command: str, output: str) -> None:
        code = re.search(r"\[exit code (\d+)\]$", output)
        timed_out = re.search(r"\[timed out after \d+s", output)
        self.commands.append((command, "timeout" if timed_out else int(code.group(1)) if code else 0))
        for test in re.findall(r"^(?:FAILED|ERROR) (\S+)|^--- FAIL: (\S+)", output, re.M):
            self.failing[test[0] or test[1]] = True

    def note_prompt(self, prompt: str) -> None:
        for line in re.split(r"(?<=[.!?。！？])\s+|\n", prompt):
            if CONSTRAINT_WORDS.search(line) and line.strip() not in self.constraints:
                self.constraints = (self.constraints + [line.strip()[:300]])[-20:]

    def facts(self, todos: list) -> list:
        """Every fact as (what it is, the words a summary that kept it would contain)."""
        facts = [("read", p) for p in self.reads] + [("wrote", p) for p in self.writes]
        facts += [("failing test", t) for t in self.failing]
        facts += [("failed command", c) for c, code in self.commands if code != 0]
        facts += [("constraint", c) for c in self.constraints] + [("todo", t["content"]) for t in todos]
        return list(dict.fromkeys(facts))

    def check(self, summary: str, todos: list) -> tuple:
        """(facts the summary kept, all facts, the ones it lost)."""
        facts = self.facts(todos)
        lost = [f for f in facts if not summary_mentions(f[1], summary)]
        return len(facts) - len(lost), len(facts), lost

    def render(self, max_tokens: int) -> str:
        lines = [f"- read {p} ({size:,} bytes, {h})" for p, (size, _, h) in self.reads.items()]
        lines += [f"- wrote {p} ({size:,} bytes, {h})" for p, (size, h) in self.writes.items()]
        lines += [f"- ran `{c[:120]}` → exit {code}" for c, code in self.commands[-10:]]
        lines += [f"- saw failing test {t}" for t in self.failing]
        lines += [f"- the user said: \"{c}\"" for c in self.constraints]
        kept = newest_within(lines, max_tokens, estimate_text_tokens)  # the newest facts when not all fit
        if not kept:
            return ""
        return "\n".join(["Fact ledger (recorded from tool calls and the user's words, not from the summary):"] + kept)


def ledger_hooks(agent) -> dict:
    """The ledger as a plug-in on the hooks: it records after each tool call and each user
    prompt, puts itself back after a summary (RestoreContext), and checks what the summary
    kept (PostCompact)."""
    def after_tool(event: dict):
        name, args = event["name"], event["input"]
        if event["is_error"]:
            return None
        if name in ("read_file", "write_file", "edit_file"):
            target = inside_workspace(agent.workdir, args["path"])
            if target and target.is_file():
                (agent.ledger.note_read if name == "read_file" else agent.ledger.note_write)(args["path"], target)
        elif name == "bash":
            agent.ledger.note_command(args["command"], event["output"])
        return None

    def on_prompt(event: dict):
        agent.ledger.note_prompt(event["prompt"])
        return None

    def restore(event: dict):
        text = agent.ledger.render(event["max_tokens"])
        return {"restore": f"{RESTORED_MARKER}: fact ledger]\n{text}"} if text else None

    def check(event: dict):
        kept, total, lost = agent.ledger.check(event["summary"], agent.state.todos)
        missing = f" (not in the summary: {'; '.join(key for _, key in lost)[:200]})" if lost else ""
        return {"note": f"ledger check: the summary mentions {kept} of {counted(total, 'fact')} the hooks "
                        f"recorded{missing}; the ledger itself is restored after it" if total else "",
                "ledger": {"retained": kept, "total": total, "lost": [f"{kind}: {key}" for kind, key in lost]}}
    return {"PostToolUse": after_tool, "UserPromptSubmit": on_prompt, "RestoreContext": restore, "PostCompact": check}


# ---- the pipeline --------------------------------------------------------------------------------

LAYER_VERBS = {"tool_result_budget": "large results → disk + preview",
               "snip_compact": "middle messages snipped",
               "micro_compact": "old results → placeholders",
               "compact_history": "messages → summary",
               "reactive_compact": "messages → summary + recent tail"}


def count_changes(name: str, before: list, after: list) -> int:
    """How many messages (or, for the result layers, tool results) a layer changed."""
    if name in ("compact_history", "reactive_compact"):
        return len(before)
    if name == "snip_compact":
        return len(before) - len(after)  # the marker joins an existing message
    changed = 0
    for old, new in zip(before, after):
        if old is not new:  # layers copy only what they change
            changed += sum(x is not y for x, y in zip(blocks_of(old), blocks_of(new)))
    return changed


def apply_layer(agent, layer, messages: list, note: str = "", **settings) -> list:
    """Run one layer with the agent's store, and report what it did, once, by comparing
    the history before and after."""
    name, first_new = layer.__name__, len(agent.store.written)
    try:
        result = layer(messages, store=agent.store, **settings)
    except OSError as err:
        # nothing may be removed unless it is on disk: keep the history as it is
        if not agent.disk_warned:
            agent.say(f"[{name}] cannot save to disk ({err}); keeping content in context instead.")
            agent.disk_warned = True
        return messages
    if result is messages:
        return messages
    saved = agent.state.tokens.estimate(messages) - agent.state.tokens.estimate(result)
    record = agent.stats.setdefault(name, {"runs": 0, "saved": 0})
    record["runs"] += 1
    record["saved"] += saved
    # The result layers may point at a copy saved earlier, so name the folder, not new files.
    where = [str(p) for p in agent.store.written[first_new:] if p.suffix == ".jsonl"] or [TOOL_RESULTS_DIR + "/"]
    change = f"−{format_tokens(saved)}" if saved >= 0 else f"+{format_tokens(-saved)}"
    changed = count_changes(name, messages, result)
    verb = LAYER_VERBS[name] if changed != 1 else \
        re.sub(r"^((?:\w+ )?\w+)s\b", r"\1", LAYER_VERBS[name]).replace("placeholders", "a placeholder")
    agent.say(f"[{name}] {changed} {verb}, "
              f"{change} tokens (saved to {', '.join(where)}){note}", "layer")
    if agent.log:  # the rewritten history itself is logged when it replaces the old one
        agent.log.write({"type": "layer", "layer": name, "saved_to": where, "tokens_saved": saved})
    return result


def nothing_to_summarize(messages: list, restored: list, tail_tokens: int) -> bool:
    """Whether the history holds little more than a summary cannot remove: what comes back
    after it, and (about) the summary already there. Then a model call would be wasted."""
    request = current_request(messages)
    # an earlier summary, and what came back after it, would only be said again
    summaries = [b["text"] for m in messages for b in blocks_of(m) if b.get(OWN) in ("compact", "reactive", "restored")]
    floor = tail_tokens + sum(map(estimate_text_tokens, restored + summaries)) + PLACEHOLDER_TOKENS
    return estimate_tokens(messages) <= floor + (estimate_text_tokens(request["text"]) if request else 0)


def summarize_history(agent, messages: list, layer=None, focus: str = "", undercount: float = 1.0) -> list:
    """compact_history (or reactive_compact) at the edges: the hooks, what comes back after
    the summary, the summary itself, and the ledger check. undercount is how far the API's
    count of a refused request exceeded our estimate."""
    layer = layer or compact_history
    for extra in fire_hooks(agent, "PreCompact", messages=messages, focus=focus):
        focus = " ".join(filter(None, [focus, extra.get("instructions", "")]))
    s, settings = agent.settings, {}
    if layer is reactive_compact:
        tail_tokens = settings["tail_tokens"] = int(s.threshold * REACTIVE_TAIL_SHARE / max(undercount, 1.0))
    else:
        mid_turn = len(messages) >= 2 and is_tool_result_message(messages[-1])
        tail_tokens = estimate_tokens(messages[-2:]) if mid_turn else 0
    restored, limit = plan_restore(agent, messages, tail_tokens)
    if layer is compact_history and nothing_to_summarize(messages, restored, tail_tokens):
        agent.say("[compact_history] nothing to compact: a summary would not make the context smaller")
        return messages
    summary, source = make_summary(agent, messages, focus, limit, undercount)
    first_new = len(agent.store.written)
    result = apply_layer(agent, layer, messages, summary=summary, restored=restored, preview_chars=s.preview_chars,
                         note=f"; summary by {source}", **settings)
    saved = [path for path in agent.store.written[first_new:] if path.suffix == ".jsonl"]
    if not saved:  # the disk refused the transcript: apply_layer said so, and the history is kept
        return messages
    transcript = agent.workdir / saved[0]
    if result is messages:
        agent.say(f"[{layer.__name__}] the summary came out no smaller than the history; the history is kept "
                  f"(transcript saved to {saved[0]})")
        return messages
    for line in [l for l in summary.splitlines() if l.strip()][:3]:
        agent.say(f"    {one_line(line, 120)}", cut=True)
    agent.state.read_state.clear()  # what was read is no longer in context as it was
    # PostCompact hooks may check the summary (the ledger does): their notes are shown, and
    # what else they return is kept with the summary in the transcript.
    answers = fire_hooks(agent, "PostCompact", messages=result, summary=summary, source=source)
    for note in [answer["note"] for answer in answers if answer.get("note")]:
        agent.say(f"    {note}")
    event = {"type": "compaction", "layer": layer.__name__, "summary_by": source, "summary": summary,
             **{key: value for answer in answers for key, value in answer.items() if key != "note"}}
    try:
        with open(transcript, "a", encoding="utf-8") as f:
            f.write(redact(json.dumps(event, ensure_ascii=False), agent.secrets) + "\n")
    except OSError:
        pass  # the messages themselves are saved; only this note is lost
    return result


def now() -> float:
    """The clock the cache's lifetime is measured on (the benchmark plays sessions on its own)."""
    return time.monotonic()


def cache_is_cold(agent) -> bool:
    """Whether the last reply came so long ago that the endpoint's prompt cache has expired."""
    idle = now() - agent.state.last_reply_at if agent.state.last_reply_at is not None else 0.0
    return idle > CACHE_TTLS[agent.settings.cache_ttl]


def compact_pipeline(agent, messages: list) -> list:
    """The four layers in order: cheap ones first, the summary only when still over the threshold."""
    s = agent.settings
    # Budget runs first: it saves big new results before anything else could shorten them.
    messages = apply_layer(agent, tool_result_budget, messages, max_chars=s.budget_chars, preview_chars=s.preview_chars)
    # snip and micro wait for a trigger: each rewrites the cached prompt after the point it changes.
    # After an idle gap the cache has expired anyway, so a rewrite costs nothing extra.
    cold = cache_is_cold(agent)
    if context_tokens(agent, messages) > (s.micro_trigger * COLD_TRIGGER_SHARE if cold else s.micro_trigger):
        messages = apply_layer(agent, snip_compact, messages, keep_head=s.snip_keep_head, keep_tail=s.snip_keep_tail,
                               at_least=s.snip_at_least, min_tokens=0 if cold else s.snip_min_tokens,
                               measure=agent.state.tokens.estimate)
        messages = apply_layer(agent, micro_compact, messages, keep_recent=s.keep_recent,
                               min_chars=s.micro_min_chars, clear_at_least=0 if cold else s.clear_at_least)
    if over_threshold(agent, messages):
        messages = summarize_history(agent, messages)
    return messages


# ---- recognising an overflow ---------------------------------------------------------------------
# reactive_compact runs when the endpoint says the prompt did not fit. Anthropic-compatible
# endpoints say so in many wordings, under different statuses, and some as a successful
# reply whose stop_reason is "model_context_window_exceeded". One table decides them all.
# Named groups: n = the prompt's tokens, m = max_tokens, t = n + m, w = the window. The
# flag is True where the endpoint counts max_tokens against the window.
OVERFLOW_WORDINGS = [
    (r"prompt is too long: (?P<n>\d+) tokens > (?P<w>\d+) maximum", False),            # Anthropic
    (r"input length and `max_tokens` exceed context limit: (?P<n>\d+) \+ (?P<m>\d+) > (?P<w>\d+)", True),  # Anthropic
    (r"maximum context length is (?P<w>\d+) tokens\. However, you requested (?P<t>\d+) tokens"
     r"(?: \((?P<n>\d+) in the messages, (?P<m>\d+) in the completion\))?", True),     # DeepSeek, OpenRouter
    (r"The input \((?P<n>\d+) tokens\) is longer than the model's context length \((?P<w>\d+) tokens\)", False),  # vLLM
    (r"maximum context length is (?P<w>\d+) tokens(?:\. However, your messages resulted in (?P<n>\d+) tokens)?",
     False),                                                                            # OpenAI-style, others
    (r"exceeded model token limit: (?P<w>\d+) \(requested: (?P<t>\d+)\)", True),      # Kimi
    (r"context window exceeds limit", True),                                           # MiniMax (code 2013)
    (r"request \((?P<n>\d+) tokens\) exceeds the available context size \((?P<w>\d+) tokens\)", False),  # llama.cpp
    (r"exceeds the available context size", False),                                   # llama.cpp, older
    (r"prompt exceeds max length|prompt (is )?too long", False),                       # GLM (code 1261), others
    (r"context_length_exceeded|ContextWindowExceeded|request_too_large"
     r"|exceeds? (the )?(model'?s? )?context (window|length)", False),                 # codes, LiteLLM, proxies
]


@dataclass
class Endpoint:
    """What the session knows about the endpoint, shared by the agent and its subagents.
    Compatible endpoints differ: their window, whether they count max_tokens against it,
    whether they offer count_tokens, and whether their usage figures add up."""
    window: int
    window_source: str = "the settings this agent was given"
    model: str = ""
    counts_output: bool = False       # the window bounds prompt + max_tokens
    can_count_tokens: bool = True     # False once count_tokens answered 404 (or failed): not asked again
    models_api: bool = True           # False once the Models API answered 404
    learned: bool = False             # the window came from an overflow: it caps any other source
    reads_in_input: bool | None = None  # do its input_tokens include the cache reads? (Kimi: yes)
    largest_accepted: tuple = (0, 0)  # (prompt, prompt + max_tokens) of the biggest request answered
    usage_note: str = ""              # set when the endpoint's usage could not be taken as it is
    startup_problem: str = ""         # what the first call at start-up ran into (no connection, a refused key)

    def accepted(self, prompt_tokens: int, max_tokens: int) -> None:
        self.largest_accepted = (max(self.largest_accepted[0], prompt_tokens),
                                 max(self.largest_accepted[1], prompt_tokens + max_tokens))

    def facts(self) -> dict:
        """What the session log keeps, so --resume starts from what was learned."""
        return {"model": self.model, "window": self.window, "window_source": self.window_source, "learned": self.learned,
                "counts_output": self.counts_output, "count_tokens": self.can_count_tokens,
                "models_api": self.models_api}


@dataclass(frozen=True)
class Overflow:
    """What the endpoint said when a prompt did not fit; a size is None when it did not say."""
    wording: str
    prompt_tokens: int | None = None
    window: int | None = None
    counts_output: bool = False


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
    words = json.dumps(body, ensure_ascii=False) if isinstance(body, (dict, list)) else str(body or err)
    if status == 429 or "rate_limit" in words:
        return None  # "Too many tokens, please wait" is about speed, not size
    for pattern, counts_output in OVERFLOW_WORDINGS:
        found = re.search(pattern, words, re.IGNORECASE)
        if found:
            sizes = {key: int(value) for key, value in found.groupdict().items() if value}
            prompt = sizes.get("n") or (sizes["t"] - max_tokens if "t" in sizes else None)
            return Overflow(found.group(0)[:100], prompt, sizes.get("w"), counts_output)
    if status == 413:  # request_too_large, sometimes with no body at all
        return Overflow("413 request too large")
    return None


def learned_window(overflow: Overflow, *, window: int, sent_tokens: int, max_tokens: int,
                   largest_accepted: tuple) -> int:
    """The window to assume after an overflow: the one it states, else an estimate below
    the rejected request and no lower than the largest request the endpoint accepted.

    largest_accepted is (prompt tokens, prompt + max_tokens) of the biggest request that got a reply."""
    if overflow.window:  # a stated limit above ours means our estimate was low, not the window
        return max(MIN_CONTEXT_WINDOW, min(overflow.window, window))
    rejected = (overflow.prompt_tokens or sent_tokens) + (max_tokens if overflow.counts_output else 0)
    accepted = largest_accepted[1] if overflow.counts_output else largest_accepted[0]
    if accepted >= rejected // 2:
        guess = accepted  # the refusal came after a small step: the limit is just above this
    elif accepted:
        guess = int((accepted * rejected) ** 0.5)  # after a big step: halfway, on a log scale
    else:
        guess = int(rejected * NO_NUMBERS_SHRINK)
    return max(MIN_CONTEXT_WINDOW, min(guess, int(rejected * 0.95), window))


def adopt_overflow(agent, err: ContextOverflow) -> bool:
    """Learn from an overflow what the endpoint's window really is, and size everything to
    it; True when the window shrank."""
    endpoint, overflow = agent.endpoint, err.overflow
    if not overflow.window and err.sent_tokens < MIN_CONTEXT_WINDOW:
        overflow = replace(overflow, counts_output=True)  # a prompt this small can only be refused for max_tokens
    endpoint.counts_output = endpoint.counts_output or overflow.counts_output
    window = learned_window(overflow, window=endpoint.window, sent_tokens=err.sent_tokens,
                            max_tokens=err.max_tokens, largest_accepted=endpoint.largest_accepted)
    shrank = window < endpoint.window
    if shrank:
        if err.overflow.window:
            agent.say(f"[window] the endpoint's limit is {window:,} tokens (was assuming {endpoint.window:,})", "layer")
            endpoint.window_source = "the endpoint's overflow message"
        else:
            output = f" + {err.max_tokens:,} for the reply" if overflow.counts_output else ""
            agent.say(f"[window] the endpoint refused about {err.sent_tokens:,} tokens{output} without naming its "
                      f"limit; assuming a window of {window:,} from now on (was {endpoint.window:,})", "layer")
            endpoint.window_source = "an overflow that named no limit (below the refused size)"
        endpoint.window, endpoint.learned = window, True
    sync_settings(agent)
    return shrank


def sync_settings(agent) -> None:
    """Size the settings to the endpoint's window (a subagent may have learned it), and
    keep what was learned in the session log, so --resume starts from it."""
    agent.settings = agent.settings.resized(agent.endpoint.window)
    if agent.log:
        agent.log.note_endpoint(agent.endpoint.facts())


def park_oversized_request(agent, messages: list) -> list:
    """After the window shrank, a request too big for it is moved to a file (as a long
    prompt is from the start), so the retry is not refused for its size again."""
    request = current_request(messages)
    if not request or estimate_text_tokens(request["text"]) <= agent.settings.threshold // 2:
        return messages
    pointer = park_long_prompt(agent, request["text"])
    for i in range(len(messages) - 1, -1, -1):
        texts = [b.get("text") for b in blocks_of(messages[i])]
        if pointer and messages[i]["role"] == "user" and request["text"] in texts:
            content = [{**b, "text": pointer} if b.get("text") == request["text"] else b for b in blocks_of(messages[i])]
            return messages[:i] + [{**messages[i], "content": content}] + messages[i + 1:]
    return messages


# ---- the request and the prompt cache ------------------------------------------------------------
# The API caches the prompt prefix up to each block marked with cache_control (tools,
# then system, then messages). A cache read costs 0.1× an input token, a cache write 1.25×.
# Marks go on copies: the history itself never holds them.

# The API caches the prompt prefix up to each block marked with cache_control (tools,
# then system, then messages). A cache read costs 0.1× an input token, a cache write 1.25×.
# Marks go on copies: the history itself never holds them.
EPHEMERAL = {"type": "ephemeral"}               # the 5-minute cache; CACHE_TTL=1h asks for an hour
CACHE_TTLS = {"5m": CACHE_LIFETIME_SECONDS, "1h": 3600}  # seconds each lives after its last read


def cache_mark(ttl: str) -> dict:
    return EPHEMERAL if ttl == "5m" else {**EPHEMERAL, "ttl": ttl}


def mark_last_block(message: dict, mark: dict = EPHEMERAL) -> dict:
    content = blocks_of(message)
    return {**message, "content": content[:-1] + [{**content[-1], "cache_control": mark}]}


def clearing_point(messages: list, keep_recent: int) -> int | None:
    """The last message before the oldest result micro_compact could clear: where its next
    clearing will start to rewrite the cache."""
    results = [i for i, m in enumerate(messages) if is_tool_result_message(m)
               for b in blocks_of(m) if b.get("type") == "tool_result" and b.get(OWN) != "placeholder"]
    clearable = results[:-keep_recent] if keep_recent else results
    return clearable[0] - 1 if clearable and clearable[0] > 0 else None


def with_cache_breakpoints(messages: list, keep_recent: int, mark: dict = EPHEMERAL) -> list:
    """Mark the newest message, and the one the previous request ended on (two back), so
    the next request reads everything up to here from the cache; and the clearing point,
    so that after a clearing the unchanged prefix before it is still read. With the system
    prompt's mark that makes four, the API's limit."""
    marked = list(messages)
    for index in {len(messages) - 1, len(messages) - 3, clearing_point(messages, keep_recent)} - {-1, -2, -3, None}:
        marked[index] = mark_last_block(marked[index], mark)
    return marked


def build_request(agent, messages: list, extra_text: str | None = None) -> dict:
    """The Messages API request for a history: tools and system first, cache marks added."""
    s = agent.settings
    system = [{"type": "text", "text": agent.system}]
    sent = [sendable(m) for m in messages]
    system[0]["cache_control"] = cache_mark(s.cache_ttl)  # one mark caches the tools and the system prompt
    sent = with_cache_breakpoints(sent, s.keep_recent, cache_mark(s.cache_ttl))
    if extra_text and sent and sent[-1]["role"] == "user":
        sent[-1] = with_text(sent[-1], extra_text)
    elif extra_text:
        sent.append({"role": "user", "content": [{"type": "text", "text": extra_text}]})
    request = {"model": s.model, "max_tokens": s.max_output, "system": system, "tools": agent.tools, "messages": sent}
    return redact_deep(request, agent.secrets) if agent.secrets else request  # the last net before it leaves


# ---- the agent loop ------------------------------------------------------------------------------

@dataclass
class LoopState:
    """What one agent loop learns while it runs. A subagent gets a new one, so it starts
    with nothing of its parent's: no todos, no reads, no size anchor."""
    history: list = field(default_factory=list)       # the messages of the running loop, for read stubs
    tokens: TokenCounter = field(default_factory=TokenCounter)
    last_usage: dict = field(default_factory=dict)
    todos: list = field(default_factory=list)
    loaded_skills: list = field(default_factory=list)
    read_state: dict = field(default_factory=dict)    # (path, offset, limit) -> (size, mtime, call id)
    read_stubs: dict = field(default_factory=dict)    # stub's call id -> (id of the result it points at, path)
    current_call: str = ""                            # the tool_use id being run
    last_reply_at: float | None = None                # now() when the last reply came: is the cache still warm?
    pending_compact: str | None = None                # the compact tool's focus, until the batch is done


@dataclass
class Agent:
    """What an agent loop runs with: the client, the settings, the workspace, what the
    session shares with subagents (endpoint, ledger, accounting), and the loop's state."""
    client: object
    settings: Settings
    workdir: Path
    system: str
    tools: list
    skills: dict = field(default_factory=dict)
    hooks: dict = field(default_factory=dict)
    confirm: object = None          # confirm(question) -> (allowed, reason)
    out: object = print
    label: str = ""
    max_steps: int = MAX_STEPS_PER_TURN
    show_status: bool = False                         # a status line after each turn (terminals only)
    color: bool = False                               # ANSI colours: a terminal, and NO_COLOR unset
    fit_width: bool = False                           # output is a terminal: fit lines to its width
    spinner_to: object = None                         # a terminal stream for the waiting spinner
    secrets: list = field(default_factory=list)       # values never to show the model or write down
    log: object = None                                # the SessionLog (none for subagents)
    endpoint: Endpoint = None                         # shared with subagents; made from settings if not given
    ledger: Ledger = field(default_factory=Ledger)
    summary_failures: int = 0
    breaker_announced: bool = False
    disk_warned: bool = False                         # a layer could not save: said once
    stats: dict = field(default_factory=dict)         # layer -> {"runs": n, "saved": tokens}
    usage_totals: dict = field(default_factory=dict)  # all calls of the session, summed
    state: LoopState = field(default_factory=LoopState)

    def __post_init__(self):
        if self.endpoint is None:
            self.endpoint = Endpoint(self.settings.window)

    @property
    def transcripts(self) -> Path:
        return self.workdir / TRANSCRIPT_DIR

    @property
    def outputs(self) -> Path:
        return self.workdir / TOOL_RESULTS_DIR

    def say(self, text: str, style: str = "", cut: bool = False) -> None:
        """Tell the user something. On a terminal each line fits its width: cut to one line
        (a preview) when cut, else wrapped at word boundaries."""
        prefix = f"  [{self.label}] " if self.label else ""
        lines = [prefix + line.expandtabs() for line in text.split("\n")]
        if columns := self.columns():
            lines = [part for line in lines for part in ([cut_to_width(line, columns - 1)] if cut else
                                                         wrapped(line, columns - 1))]
        text = "\n".join(lines)
        self.out(f"{STYLES[style]}{text}\033[0m" if self.color and style else text)

    def columns(self) -> int | None:
        """The terminal's width now (it may have been resized); None when output is not a terminal."""
        return shutil.get_terminal_size().columns if self.fit_width else None

    def subagent(self) -> "Agent":
        tools = [t for t in self.tools if t["name"] != "task"]
        return replace(self, tools=tools, label="task", max_steps=SUBAGENT_MAX_STEPS, log=None, state=LoopState())

    @cached_property
    def store(self) -> "Store":
        """Where the layers save what they remove (a subagent gets its own, same folders)."""
        return Store(self.workdir, self.secrets)

    @cached_property
    def overhead(self) -> int:
        """Tokens of the system prompt and tool definitions, sent with every request."""
        return estimate_text_tokens(self.system + json.dumps(self.tools))


def build_system_prompt(workdir: Path, skills: dict) -> str:
    listed = "\n".join(f"- {name}: {s['description']}" for name, s in skills.items()) or "(none)"
    return (f"You are a coding agent working in {workdir}. Use the tools to inspect and change files "
            "and to run commands; keep going until the user's request is done, then answer briefly.\n"
            "Long conversations are compacted: old tool results become pointers to files under "
            f"{TOOL_RESULTS_DIR}/ and old messages are summarized. Read those files again when you "
            "need the details. Call compact yourself when you finish a phase of work.\n"
            f"Skills (load one with load_skill before using it):\n{listed}")


def append_message(agent, messages: list, message: dict) -> None:
    """Append a message to the history, and to the session log the same moment."""
    messages.append(message)
    if agent.log:
        record, tokens = {"type": "message", "message": message}, agent.state.tokens
        if tokens.anchor_messages and message is tokens.anchor_messages[-1]:
            record["context_tokens"] = tokens.anchor_tokens  # the reply's usage: --resume starts exact
        agent.log.write(record)


def replace_history(agent, messages: list, new: list, reason: str) -> None:
    """Put a rewritten history in place (same list object), and record what changed."""
    if new is messages:
        return
    if agent.log:  # the "layer" records before it say what acted, and where the removed content went
        agent.log.write({"type": "rewrite", "reason": reason, "parts": rewrite_parts(messages, new)})
    messages[:] = new


def rewrite_parts(old: list, new: list) -> list:
    """The new history as runs of the old one, [start, end), and the messages that are new:
    layers copy only what they change, so what they kept is found by identity. The log
    then grows with what changed, not with the length of the history."""
    where = {id(message): index for index, message in enumerate(old)}
    parts = []
    for message in new:
        index = where.get(id(message))
        if index is None:
            parts.append({"message": message})
        elif parts and isinstance(parts[-1], list) and parts[-1][1] == index:
            parts[-1][1] = index + 1
        else:
            parts.append([index, index + 1])
    return parts


def apply_rewrite(history: list, parts) -> list | None:
    """A logged rewrite replayed on the history it was made from; None when it does not fit."""
    if not isinstance(parts, list):
        return None
    new = []
    for part in parts:
        if isinstance(part, list) and len(part) == 2 and all(isinstance(n, int) for n in part) \
                and 0 <= part[0] < part[1] <= len(history):
            new.extend(history[part[0]:part[1]])
        elif isinstance(part, dict) and is_message(part.get("message")):
            new.append(part["message"])
        else:
            return None
    return new


INTERRUPTED = "[Interrupted by the user: this request was cancelled. Do not resume it unless the user asks.]"


def record_interruption(agent, messages: list, partial: str) -> None:
    """After Ctrl-C, the history says so: the reply the user saw stream (if any) is kept,
    marked interrupted, and the model is told the work was cancelled. The next prompt is
    then a message of its own, not merged into the cancelled one."""
    if not messages or messages[-1]["role"] != "user":
        return
    said = f"{partial.rstrip()}\n\n{INTERRUPTED}" if partial.strip() else INTERRUPTED
    append_message(agent, messages, {"role": "assistant", "content": [own_text("interrupted", said)]})


def true_stubs(messages: list, stubs: dict) -> list:
    """A repeated read answered "as in result X above" must stay true in what is sent: when
    a layer has since cleared X (or a summary took it), the stub says where the text went."""
    if not stubs:
        return messages
    found = {b["tool_use_id"]: b for m in messages for b in blocks_of(m) if b.get("type") == "tool_result"}
    stale = {call: (target, path) for call, (target, path) in stubs.items()
             if call in found and OWN not in found[call] and (target not in found or OWN in found[target])}
    if not stale:
        return messages
    out = []
    for message in messages:
        if any(b.get("tool_use_id") in stale for b in blocks_of(message)):
            message = {**message, "content": [restub(b, *stale[b["tool_use_id"]], found.get(stale[b["tool_use_id"]][0]))
                                              if b.get("tool_use_id") in stale else b for b in blocks_of(message)]}
        out.append(message)
    return out


def restub(block: dict, target: str, path: str, earlier: dict | None) -> dict:
    where = f"its full text is saved at {earlier['saved_at']}" if earlier and earlier.get("saved_at") else \
        "it is no longer in the conversation"
    return replace_result(block, f"(a repeat read of {path}: the earlier result {target} was cleared since, and "
                                 f"{where}; call read_file on {path} again to see it)", "stub")


def call_model(agent, messages: list) -> tuple:
    """One model call: (assistant message, stop_reason). The main agent's text is printed
    as it arrives. Raises ContextOverflow when the prompt did not fit."""
    printed, wrap = [], WordWrap(agent.columns())

    def show(chunk: str) -> None:
        agent.out(wrap.feed(chunk), end="", flush=True)
        printed.append(chunk)
    try:
        answer = send_request(agent, build_request(agent, messages), context_tokens(agent, messages),
                              on_text=None if agent.label else show)
    except KeyboardInterrupt as stop:
        agent.out(wrap.finish(), end="", flush=True)
        stop.partial = "".join(printed)  # what the user saw stays in the history (record_interruption)
        raise
    if printed:
        agent.out(wrap.finish())
    reply, agent.state.last_reply_at = answer.message, now()
    if answer.prompt_tokens:  # usage is exact: it anchors the size of history + reply
        output = answer.usage.get("output_tokens") or agent.state.tokens.size(reply)
        agent.state.tokens.anchor(answer.prompt_tokens + output, messages + [reply])
    return reply, answer.stop_reason


def make_reply_sendable(agent, messages: list, reply: dict, stop_reason: str) -> tuple:
    """Fix what would break the next request: a tool call cut off by max_tokens (dropped,
    with a note for the model), a tool_use id used before (renamed), and an input that is
    not a JSON object (kept as {} so later requests stay valid, and answered with an error).
    Returns (reply, note, {tool_use id: why it will not run})."""
    content, note, refused = list(reply["content"]), "", {}
    if stop_reason == "max_tokens" and content and content[-1].get("type") == "tool_use":
        cut = content.pop()  # its input is incomplete: never run it
        note = (f"{NOTE_MARKER}: your reply reached the output limit ({agent.settings.max_output:,} tokens) in the "
                f"middle of a call to {cut['name']}, so that call was not run. Continue from there, and split "
                "large content into several smaller calls.]")
    seen = set(tool_names(messages))
    for k, block in enumerate(content):
        if block.get("type") == "tool_use":
            unique, n = block["id"], 1
            while unique in seen:
                unique, n = f"{block['id']}_{n}", n + 1
            seen.add(unique)
            content[k] = {**block, "id": unique}
            if not isinstance(block["input"], dict):
                refused[unique] = (f"its input was not a JSON object (received {one_line(json.dumps(block['input']), 80)}),"
                                   " so it was not run")
                content[k]["input"] = {}
    if content == reply["content"]:
        return reply, note, refused  # the same object: the token counter's anchor still knows it
    return {**reply, "content": content or [{"type": "text", "text": "(reply cut off)"}]}, note, refused


def use_tools(agent, tool_uses: list, refused: dict) -> tuple:
    """Run every call in order (a refused one is answered with why). On Ctrl-C the rest
    are answered as interrupted."""
    results = []
    try:
        for block in tool_uses:
            if block["id"] in refused:
                agent.say(f"  ✗ {block['name']}: {refused[block['id']]}", "error")
                results.append({"type": "tool_result", "tool_use_id": block["id"], "is_error": True,
                                "content": f"Error: this call to {block['name']} failed: {refused[block['id']]}. "
                                           "Call it again with a JSON object as its input."})
            else:
                results.append(use_tool(agent, block))
        return results, False
    except KeyboardInterrupt:
        for block in tool_uses[len(results):]:
            results.append({"type": "tool_result", "tool_use_id": block["id"], "is_error": True,
                            "content": "Interrupted by the user before this finished."})
        return results, True


def agent_loop(agent, messages: list) -> str | None:
    """One user turn: compact, call the model, run its tools, repeat until it stops calling tools."""
    reactive_retries = 0
    agent.state.history = messages  # the same list object: read_file checks it for repeat reads
    for _ in range(agent.max_steps):
        sync_settings(agent)  # a subagent may have learned the endpoint's window
        replace_history(agent, messages, compact_pipeline(agent, messages), "compaction")
        replace_history(agent, messages, true_stubs(messages, agent.state.read_stubs), "read stubs re-pointed")
        try:
            reply, stop_reason = call_model(agent, messages)
        except ContextOverflow as err:
            shrank = adopt_overflow(agent, err)  # a smaller window: every threshold is recomputed first
            if reactive_retries >= MAX_REACTIVE_RETRIES:
                raise
            reactive_retries += 1
            replace_history(agent, messages, park_oversized_request(agent, messages), "request parked")
            if shrank and context_tokens(agent, messages) <= agent.settings.threshold:
                continue  # the history fits the window learned: only max_tokens was too big for it
            counted = err.overflow.prompt_tokens
            undercount = counted / err.sent_tokens if counted else 1.0
            replace_history(agent, messages, summarize_history(agent, messages, reactive_compact, undercount=undercount),
                           "reactive_compact")
            continue
        reply, note, refused = make_reply_sendable(agent, messages, reply, stop_reason)
        append_message(agent, messages, reply)
        tool_uses = [b for b in reply["content"] if b.get("type") == "tool_use"]
        if not tool_uses and note:  # cut short: tell the model and let it go on
            append_message(agent, messages, {"role": "user", "content": [own_text("note", note)]})
            continue
        if not tool_uses:
            final = "\n".join(b["text"] for b in reply["content"] if b.get("type") == "text")
            fire_hooks(agent, "Stop", messages=messages, final=final)
            return final
        results, interrupted = use_tools(agent, tool_uses, refused)
        notes = [own_text("note", note)] if note else []
        append_message(agent, messages, {"role": "user", "content": results + notes})
        if interrupted:
            agent.state.pending_compact = None  # an interrupted batch leaves nothing to do later
            raise KeyboardInterrupt
        if agent.state.pending_compact is not None:
            focus, agent.state.pending_compact = agent.state.pending_compact, None
            replace_history(agent, messages, summarize_history(agent, messages, focus=focus), "compact tool")
    agent.say(f"[stopped after {agent.max_steps} model calls in one turn; send a message to continue]")
    return None


# ---- earlier chapters: the tools, hooks, the permission check ------------------------------------

class ToolError(Exception):
    """A tool failure the model can act on; the message says what to try next."""


def tool(name: str, description: str, required: tuple, /, **properties) -> dict:
    """One tool definition as the API takes it: a name, what it does, a JSON Schema."""
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": properties, "required": list(required)}}


TEXT, NUMBER = {"type": "string"}, {"type": "integer"}
TODO_ITEM_SCHEMA = {"type": "object", "required": ["content", "status"], "properties": {
    "content": TEXT, "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}}}

TOOLS = [
    tool("bash", "Run a shell command in the workspace. Output is capped; redirect large output to a file and "
         "read parts of it.", ("command",),
         command=TEXT, timeout={"type": "integer", "description": f"seconds, default {BASH_TIMEOUT}, max 600"}),
    tool("read_file", "Read a text file, with line numbers. offset is the first line (1-based), limit the "
         f"number of lines (default {READ_DEFAULT_LINES}).", ("path",), path=TEXT, offset=NUMBER, limit=NUMBER),
    tool("write_file", "Create or overwrite a file with the given content.", ("path", "content"),
         path=TEXT, content=TEXT),
    tool("edit_file", "Replace old_text with new_text in a file. old_text must occur exactly once.",
         ("path", "old_text", "new_text"), path=TEXT, old_text=TEXT, new_text=TEXT),
    tool("glob", "List files matching a pattern such as '**/*.py', relative to the workspace (or to path "
         "inside it).", ("pattern",), pattern=TEXT, path=TEXT),
    tool("todo_write", "Replace the todo list. Each item has content and a status: pending, in_progress or "
         "completed; at most one item is in_progress.", ("items",), items={"type": "array", "items": TODO_ITEM_SCHEMA}),
    tool("task", "Hand a self-contained job to a subagent with a fresh context. It has the same tools except "
         "task, and returns its final answer.", ("prompt",), prompt=TEXT, description=TEXT),
    tool("load_skill", "Load the full instructions of a skill listed in the system prompt.", ("name",), name=TEXT),
    tool("compact", "Summarize the conversation so far to free context. Runs after the current tool calls; "
         "focus says what the summary must keep.", (), focus=TEXT),
]


JSON_TYPES = {"string": str, "integer": int, "array": list, "object": dict, "boolean": bool}


def check_tool_input(schema: dict, args) -> str | None:
    """Return what is wrong with a tool call's input, or None when it fits the schema.
    Arguments the schema does not list are not wrong (JSON Schema allows them); use_tool
    leaves them out."""
    if not isinstance(args, dict):
        return "the input must be a JSON object"
    missing = [key for key in schema.get("required", []) if key not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    for key, value in args.items():
        if key not in schema.get("properties", {}):
            continue
        expected = schema["properties"][key].get("type")
        python_type = JSON_TYPES.get(expected)
        wrong_bool = python_type is int and isinstance(value, bool)
        if python_type and (not isinstance(value, python_type) or wrong_bool):
            return f"argument '{key}' must be of type {expected}, got {type(value).__name__}"
    return None


def use_tool(agent, block: dict) -> dict:
    """Run one tool call through the hooks; always returns a tool_result block."""
    name, args = block["name"], block["input"]
    agent.say(f"> {name}: {one_line(json.dumps(args, ensure_ascii=False), 90)}", "tool", cut=True)
    schema = next((t["input_schema"] for t in agent.tools if t["name"] == name), None)
    if schema is None:
        output, failed = (f"Error: unknown tool '{name}'. Available tools: "
                          f"{', '.join(t['name'] for t in agent.tools)}."), True
    elif problem := check_tool_input(schema, args):
        output, failed = f"Error: {name} was called wrongly: {problem}. Call it again with valid input.", True
    elif denied := [r["deny"] for r in fire_hooks(agent, "PreToolUse", name=name, input=args) if "deny" in r]:
        output, failed = denied[0], True
    else:
        agent.state.current_call = block["id"]
        known = {key: value for key, value in args.items() if key in schema.get("properties", {})}
        try:
            with Spinner(agent.spinner_to if name != "task" else None, f"running {name}"):
                output, failed = TOOL_HANDLERS[name](agent, **known), False
        except ToolError as err:
            output, failed = f"Error: {err}", True
        except (OSError, ValueError, ContextOverflow, *api_failures()) as err:
            output, failed = f"Error: {name} failed: {type(err).__name__}: {err}", True
        if ignored := sorted(set(args) - set(known)):
            output += f"\n(ignored argument(s) {name} does not take: {', '.join(ignored)})"
        fire_hooks(agent, "PostToolUse", name=name, input=args, output=output, is_error=failed)
    output = redact(output, agent.secrets)  # a secret printed by a tool never reaches the model or disk
    if name == "todo_write" and not failed:  # the list itself, an item a line, shown once
        agent.say("  " + output.replace("\n", "\n  "), "tool", cut=True)
    else:
        agent.say(f"  {'✗' if failed else '<'} {one_line(output)}", "error" if failed else "tool", cut=True)
    result = {"type": "tool_result", "tool_use_id": block["id"], "content": output}
    return {**result, "is_error": True} if failed else result


def inside_workspace(workdir: Path, path: str) -> Path | None:
    """Resolve a path (symlinks included); None when it lands outside the workspace."""
    root = workdir.resolve()
    target = (root / path).resolve()
    return target if target == root or target.is_relative_to(root) else None


def workspace_path(agent, path: str) -> Path:
    target = inside_workspace(agent.workdir, path)
    if target is None:
        raise ToolError(f"{path} is outside the workspace {agent.workdir}. Use a path inside it.")
    return target


def run_bash(agent, command: str, timeout: int = BASH_TIMEOUT) -> str:
    # A new session makes the command its own process group, so a timeout (or Ctrl-C)
    # kills everything it started, not just the shell. Secret variables are not passed
    # on: `env` must not be one call away from the key.
    timeout = max(1, min(timeout, 600))
    environment = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    proc = subprocess.Popen(["bash", "-c", command], cwd=agent.workdir, stdin=subprocess.DEVNULL, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    captured = CapturedOutput(agent.outputs, agent.secrets)
    reader = threading.Thread(target=captured.drain, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        code, timed_out = proc.wait(), True
    except KeyboardInterrupt:
        _kill_group(proc)
        captured.finish(None)
        raise
    reader.join(timeout=0.5)  # a background child may keep the pipe open; do not wait for it
    saved = captured.finish(agent.state.current_call or "bash")
    parts = [captured.text(saved and saved.relative_to(agent.workdir)).strip("\n")]
    if timed_out:
        parts.append(f"[timed out after {timeout}s; the command and its children were killed]")
    elif code != 0:
        parts.append(f"[exit code {code}]")
    return "\n".join(p for p in parts if p) or "(no output)"


class CapturedOutput:
    """A command's output as it arrives. Every byte goes to a file in the tool-results
    folder, secrets redacted on the way; only the head and the tail stay in memory, so
    100 MB of output costs what 220 KB does. The file is kept only when the output was
    too long to show whole."""

    def __init__(self, folder: Path, secrets: list):
        self.folder, self.file, self.unsaved = folder, None, None
        self.secrets = sorted({v.encode("utf-8", "surrogatepass") for v in secrets}, key=len, reverse=True)
        self.overlap = max(map(len, self.secrets), default=1) - 1  # a secret may straddle two chunks
        self.carry, self.head, self.tail, self.total = b"", bytearray(), bytearray(), 0
        self.lock, self.done = threading.Lock(), False

    def drain(self, pipe) -> None:
        while chunk := pipe.read1(65536):
            with self.lock:
                if self.done:
                    return
                data = redact_bytes(self.carry + chunk, self.secrets)
                cut = max(len(data) - self.overlap, 0)
                self.carry = data[cut:]
                self.keep(data[:cut])

    def keep(self, data: bytes) -> None:
        self.total += len(data)
        room = BASH_OUTPUT_HEAD - len(self.head)
        self.head += data[:max(room, 0)]
        if room < len(data):
            self.tail = (self.tail + data[max(room, 0):])[-BASH_OUTPUT_TAIL:]
        if self.unsaved is None and data:
            try:
                if self.file is None:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    self.file = tempfile.NamedTemporaryFile(dir=self.folder, prefix=".bash-", suffix=".partial",
                                                            delete=False)
                self.file.write(data)
            except OSError as err:
                self.unsaved = err  # the head and tail are still shown; the note says the rest is lost

    def finish(self, tool_use_id: str | None) -> Path | None:
        """Stop reading; keep the file under the call's id if the output was cut, else remove it."""
        with self.lock:
            self.done = True
            self.keep(self.carry)
            self.carry = b""
            if self.file is None:
                return None
            self.file.close()
            partial = Path(self.file.name)
            try:
                if tool_use_id is None or self.total <= len(self.head) or self.unsaved:
                    partial.unlink(missing_ok=True)
                    return None
                return keep_as(partial, self.folder, tool_use_id)
            except OSError as err:
                self.unsaved = err
                return None

    def text(self, saved: Path | None) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.tail:
            return head
        omitted = self.total - len(self.head) - len(self.tail)
        where = f"the whole output is saved at {saved}; read_file (offset/limit) or grep it for the part you need" \
            if saved else "redirect the output to a file and read the part you need"
        return f"{head}\n[... {omitted:,} bytes of output omitted ({self.total:,} in all); {where} ...]\n" + \
            self.tail.decode("utf-8", "replace")


def redact_bytes(data: bytes, secrets: list) -> bytes:
    for value in secrets:
        data = data.replace(value, b"[redacted]")
    return data


def keep_as(partial: Path, folder: Path, tool_use_id: str) -> Path:
    """Give a finished file its name, <id>.txt (or <id>-N.txt), never replacing another."""
    for target in output_names(folder, tool_use_id):
        try:
            os.link(partial, target)  # fails, rather than replaces, if the name is taken
        except FileExistsError:
            continue
        except OSError:  # a file system without hard links
            if target.exists():
                continue
            os.replace(partial, target)
            return target
        partial.unlink()
        return target
    return partial


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_read_file(agent, path: str, offset: int = 1, limit: int = READ_DEFAULT_LINES) -> str:
    target = workspace_path(agent, path)
    if not target.is_file():
        raise ToolError(f"{path} not found (or not a file). Call glob to list files.")
    offset, limit = max(offset, 1), max(limit, 1)
    key, stat = (str(target), offset, limit), target.stat()
    seen = agent.state.read_state.get(key)
    if seen and seen[:2] == (stat.st_size, stat.st_mtime_ns) and still_in_context(agent.state.history, seen[2]):
        # the same bytes are already in the conversation: say so instead of sending them twice
        agent.state.read_stubs[agent.state.current_call] = (seen[2], path)
        return f"(unchanged: {path}, lines from {offset}, is exactly as in result {seen[2]} above)"
    agent.state.read_state[key] = (stat.st_size, stat.st_mtime_ns, agent.state.current_call)
    with open(target, "rb") as f:
        if b"\0" in f.read(8192):
            raise ToolError(f"{path} is a binary file ({target.stat().st_size:,} bytes); read_file shows "
                            "text only. Use bash (for example `file` or `xxd | head`) to inspect it.")
        f.seek(0)
        return _numbered_lines(f, path, offset, limit)


def _bounded_lines(f):
    """Lines of a binary file, each cut to a few KB: a 1 GB file with no newline never
    lands in memory whole."""
    while raw := f.readline(READ_MAX_LINE_CHARS * 4):
        if not raw.endswith(b"\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass  # skip the rest of an overlong line, a megabyte at a time
        yield raw


def _numbered_lines(f, path: str, offset: int, limit: int) -> str:
    # Reads line by line, so a 1 GB file costs only the lines asked for.
    out, size, number = [], 0, 0
    for number, raw in enumerate(_bounded_lines(f), start=1):
        if number < offset:
            continue
        if number >= offset + limit or size > READ_MAX_CHARS:
            out.append(f"[more lines follow; call read_file with offset={number} to continue]")
            break
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if len(line) > READ_MAX_LINE_CHARS:
            line = line[:READ_MAX_LINE_CHARS] + f" [line cut at {READ_MAX_LINE_CHARS} chars]"
        out.append(f"{number:>6}\t{line}")
        size += len(line) + 8
    if not out:
        return f"(empty: {path} has {number} lines; offset {offset} is past the end)" if number \
            else f"(empty file: {path})"
    return "\n".join(out)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(target: Path, data: bytes) -> None:
    """Write beside the target, flush to disk, then rename over it: a write that fails
    half-way (a full disk, say) leaves the original file exactly as it was."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~current_umask()
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, mode)  # the file keeps its permissions (a new one gets the usual ones)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def run_write_file(agent, path: str, content: str) -> str:
    target = workspace_path(agent, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8", "surrogatepass")
    try:
        write_atomically(target, data)
    except OSError as err:
        raise ToolError(f"could not write {path} ({err.strerror or err}); the file is unchanged.") from None
    return f"Wrote {len(data):,} bytes to {path}"


def run_edit_file(agent, path: str, old_text: str, new_text: str) -> str:
    target = workspace_path(agent, path)
    if not target.is_file():
        raise ToolError(f"{path} not found. Call glob to list files, or write_file to create it.")
    if target.stat().st_size > EDIT_MAX_BYTES:
        raise ToolError(f"{path} is {target.stat().st_size:,} bytes, too big for edit_file; use bash (sed, patch).")
    try:
        text = target.read_bytes().decode("utf-8")  # bytes, so CRLF and lone CR stay as they are
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not UTF-8 text; edit_file cannot change it safely. Use bash.")
    count = text.count(old_text) if old_text else 0
    if count == 0 and "\r\n" in text and "\n" in old_text and "\r" not in old_text + new_text:
        # read_file shows lines without their CR: match the file's own line endings
        old_text, new_text = old_text.replace("\n", "\r\n"), new_text.replace("\n", "\r\n")
        count = text.count(old_text)
    if count != 1:
        hint = "read the file again and copy the exact text (whitespace matters)" if count == 0 \
            else "include more surrounding lines so it matches exactly once"
        raise ToolError(f"old_text was found {count} times in {path}; it must occur exactly once: {hint}.")
    try:
        write_atomically(target, text.replace(old_text, new_text, 1).encode("utf-8"))
    except OSError as err:
        raise ToolError(f"could not write {path} ({err.strerror or err}); the file is unchanged.") from None
    return f"Edited {path}"


def printable(name: str) -> str:
    """A file name whose bytes are not UTF-8, with those bytes shown as \ufffd: it can be
    printed, logged and sent (an undecodable name arrives with lone surrogates)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def run_glob(agent, pattern: str, path: str = ".") -> str:
    base = workspace_path(agent, path)
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise ToolError("glob patterns are relative to the workspace: drop the leading / and any '..'.")
    root = agent.workdir.resolve()
    matches = sorted(printable(str(p.relative_to(root))) for p in base.glob(pattern)
                     if p.resolve().is_relative_to(root) and ".git" not in p.relative_to(root).parts)
    if not matches:
        return f"No files match {pattern!r} under {path}."
    shown = "\n".join(matches[:GLOB_MAX_RESULTS])
    if len(matches) > GLOB_MAX_RESULTS:
        shown += f"\n[showing {GLOB_MAX_RESULTS} of {len(matches)} matches; use a narrower pattern]"
    return shown


def run_todo_write(agent, items: list) -> str:
    for n, item in enumerate(items):
        problem = check_tool_input(TODO_ITEM_SCHEMA, item)
        if problem or item["status"] not in ("pending", "in_progress", "completed"):
            raise ToolError(f"item {n}: {problem or 'status must be pending, in_progress or completed'}")
    if sum(item["status"] == "in_progress" for item in items) > 1:
        raise ToolError("only one item may be in_progress at a time; mark the others pending or completed.")
    agent.state.todos = [{"content": i["content"], "status": i["status"]} for i in items]
    return render_todos(agent.state.todos)


def render_todos(todos: list) -> str:
    marks = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]"}
    return "\n".join(f"{marks[t['status']]} {t['content']}" for t in todos) or "(todo list is empty)"


def run_task(agent, prompt: str, description: str = "") -> str:
    child = agent.subagent()
    agent.say(f"[task] subagent started: {description or prompt[:60]}")
    final = agent_loop(child, [{"role": "user", "content": [{"type": "text", "text": prompt}]}])
    agent.say("[task] subagent finished")
    return final or "(the subagent stopped without a final answer)"


def run_load_skill(agent, name: str) -> str:
    skill = agent.skills.get(name)
    if skill is None:
        raise ToolError(f"no skill named {name!r}. Available: {', '.join(agent.skills) or 'none'}.")
    if name not in agent.state.loaded_skills:
        agent.state.loaded_skills.append(name)
    return f"<skill name=\"{name}\">\n{skill['body']}\n</skill>"


def run_compact(agent, focus: str = "") -> str:
    agent.state.pending_compact = focus or ""
    return "Compaction will run after this batch of tool calls; the conversation continues from the summary."


TOOL_HANDLERS = {"bash": run_bash, "read_file": run_read_file, "write_file": run_write_file,
                 "edit_file": run_edit_file, "glob": run_glob, "todo_write": run_todo_write,
                 "task": run_task, "load_skill": run_load_skill, "compact": run_compact}


def discover_skills(folders: list) -> dict:
    """Find skills/<name>/SKILL.md files; front matter gives name and description."""
    skills = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("*/SKILL.md")):
            text = path.read_text(encoding="utf-8", errors="replace")
            match = re.match(r"^---\s*\n(.*?)\n---\s*\n?(.*)$", text, re.S)
            meta = dict(re.findall(r"^(\w+):\s*(.+?)\s*$", match.group(1), re.M)) if match else {}
            name = meta.get("name", path.parent.name)
            skills.setdefault(name, {"description": meta.get("description", ""),
                                     "body": (match.group(2) if match else text).strip(), "path": path})
    return skills


HOOK_EVENTS = ("UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "PreCompact", "RestoreContext", "PostCompact")


DENY_PATTERNS = [r"\brm\s+-[a-zA-Z]*r[a-zA-Z]*f?\s+(/|~|\$HOME)(\s|$)", r"\bsudo\b", r"\bmkfs",
                 r"\bdd\b.*\bof=/dev/", r"\b(shutdown|reboot|halt|poweroff)\b", r":\(\)\s*\{",
                 r">\s*/dev/sd", r"\bchmod\s+-R\s+777\s+/(\s|$)"]


CONFIRM_PATTERNS = [r"\brm\b", r"\bgit\s+push\b", r"\bgit\s+reset\s+--hard", r"\bgit\s+clean\b",
                    r"\bgit\s+checkout\s+--\s", r"\bchmod\b", r"\bchown\b", r"\bkill(all)?\b",
                    r"\btruncate\b", r"\bmv\b"]


FILE_TOOLS = ("read_file", "write_file", "edit_file", "glob")


def check_permission(name: str, args: dict, workdir: Path) -> tuple:
    """Decide "allow", "deny" or "ask" for one tool call, with the reason."""
    if name == "bash":
        command = str(args.get("command", ""))
        if any(re.search(p, command) for p in DENY_PATTERNS):
            return "deny", f"`{command}` is on the deny list"
        if any(re.search(p, command) for p in CONFIRM_PATTERNS):
            return "ask", f"`{command}` can destroy work"
    if name in FILE_TOOLS:
        path = str(args.get("path", "."))
        if inside_workspace(workdir, path) is None:
            return "deny", f"{path} is outside the workspace {workdir}"
    return "allow", ""


def permission_hook(agent):
    """The PreToolUse hook that asks check_permission and, for "ask", the person."""
    def hook(event: dict):
        decision, reason = check_permission(event["name"], event["input"], agent.workdir)
        if decision == "allow":
            return None
        if decision == "ask":
            allowed, why = agent.confirm(f"{event['name']}: {reason}. Allow?")
            if allowed:
                return None
            reason = f"{reason} and {why}"
        return {"deny": f"Permission denied: {reason}. Ask the user, or find a safer way."}
    return hook


def fire_hooks(agent, event: str, **payload) -> list:
    """Run every hook for an event; return what they returned (None dropped)."""
    return [r for hook in agent.hooks.get(event, []) if (r := hook(payload)) is not None]


def install_default_hooks(agent) -> None:
    """Every hook event, with the permission check and the ledger's recorders installed."""
    agent.hooks = {event: [] for event in HOOK_EVENTS}
    agent.hooks["PreToolUse"].append(permission_hook(agent))
    for event, hook in ledger_hooks(agent).items():
        agent.hooks[event].append(hook)


# ==== PART 2: THE COMMAND LINE AROUND IT ==========================================================
# Everything a person at a terminal needs, and nothing the chapter is about: reading and
# retrying API replies, secrets, the session log and --resume, the REPL and its commands,
# and configuration.


# ---- reading a reply -----------------------------------------------------------------------------
# The events are read here, not by the SDK's stream helper, because compatible endpoints
# differ exactly where that helper assumes: usage may be missing or null, input_tokens may
# be 0 until the end, an event may not be JSON, a stream may come as one JSON body, and an
# error may arrive inside a 200. Each becomes one exception the loop can report.

class BadReply(Exception):
    """A reply that broke off or could not be read: a dropped or silent stream, an event
    that is not JSON, an empty body. Another try may well get a good one."""


class ErrorEvent(Exception):
    """An error the endpoint sent inside a 200 stream. Like the SDK's errors it has
    status_code and body, so context_overflow and api_error_text read it the same way."""

    def __init__(self, body):
        error = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
        self.status_code, self.body, self.kind = 200, body, str(error.get("type") or error.get("code") or "")
        super().__init__(f"{self.kind or 'error'}: {error.get('message', body)}")


def api_failures() -> tuple:
    """Every way one call can fail: the SDK's errors, and what we find wrong in a reply."""
    return anthropic.APIError, BadReply, ErrorEvent


def worth_retrying(err: Exception) -> bool:
    """429, 5xx and 529, a reply that broke off, an "overloaded" error inside a stream."""
    if isinstance(err, ErrorEvent):
        return err.kind in ("overloaded_error", "api_error", "rate_limit_error")
    return isinstance(err, (anthropic.RateLimitError, anthropic.InternalServerError,
                            anthropic.APIConnectionError, BadReply))


def with_retries(agent, call):
    """Make an API call; retry what may pass on its own a bounded number of times,
    saying so in one line each time."""
    for attempt in range(1, MAX_API_ATTEMPTS + 1):
        try:
            return call()
        except api_failures() as err:
            if attempt == MAX_API_ATTEMPTS or not worth_retrying(err):
                raise
            response = getattr(err, "response", None)
            try:  # the API's own advice first
                delay = max(0.0, min(float(response.headers.get("retry-after")), 60.0))
            except (AttributeError, TypeError, ValueError):
                delay = agent.settings.retry_base_seconds * 2 ** (attempt - 1) * random.uniform(0.8, 1.2)
            agent.say(f"[api] {api_error_text(err)}; retrying in {delay:.1f}s "
                      f"(retry {attempt} of {MAX_API_ATTEMPTS - 1})")
            time.sleep(delay)


def api_error_text(err: Exception) -> str:
    """One line for a person: the status, the error's kind and its message, and the URL
    where that URL is what to check."""
    if isinstance(err, ErrorEvent):
        return f"error inside the reply stream: {err}"
    url = str(getattr(getattr(err, "request", None), "url", "") or "").split("?")[0] or "the API"
    url = re.sub(r"//[^/@\s]*@", "//", url)  # a proxy's user:password never goes on screen
    from_url = f" (from {url})" if getattr(err, "status_code", None) in (401, 403, 404) else ""
    body = getattr(err, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        kind = error.get("type") or error.get("code") or "error"
        return f"{getattr(err, 'status_code', '')} {kind}: {error.get('message')}{from_url}"
    if isinstance(err, anthropic.APITimeoutError):
        return (f"{url} did not answer in time (API_CONNECT_TIMEOUT, API_IDLE_TIMEOUT); "
                "check ANTHROPIC_BASE_URL and the network")
    if isinstance(err, anthropic.APIConnectionError):
        return f"cannot reach {url} ({err.__cause__ or err}); check ANTHROPIC_BASE_URL and the network"
    if isinstance(err, anthropic.APIStatusError):
        return f"{err.status_code} {one_line(str(body or err), 200)}{from_url}"
    return str(err)


USAGE_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")


def add_usage(usage: dict, figures) -> None:
    """Fold one event's usage in: a missing or null figure never lowers one already seen."""
    for key in USAGE_KEYS:
        value = figures.get(key) if isinstance(figures, dict) else None
        if isinstance(value, int) and value > usage.get(key, 0):
            usage[key] = value


def apply_event(kind: str, data: dict, blocks: dict, usage: dict, on_text) -> str | None:
    """Fold one stream event into the blocks being built; return a stop_reason if it has one."""
    if kind == "message_start":
        add_usage(usage, data["message"].get("usage"))
    elif kind == "content_block_start":
        block = dict(data["content_block"])
        if block["type"] == "tool_use":
            block["partial_json"] = ""
        blocks[data["index"]] = block
    elif kind == "content_block_delta":
        block, delta = blocks[data["index"]], data["delta"]
        field_of = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking",
                    "signature_delta": "signature"}
        name = field_of.get(delta["type"])
        if name:
            block[name] = (block.get(name) or "") + delta[name]
        if name == "text" and on_text:
            on_text(delta["text"])
    elif kind == "message_delta":
        add_usage(usage, data.get("usage"))
        return (data.get("delta") or {}).get("stop_reason")
    return None


def tool_input(block: dict):
    """A tool call's input: the streamed JSON if any, else what the block started with.
    Text that is not JSON comes back as the string it is; make_reply_sendable answers it."""
    raw = block.pop("partial_json", "")
    if not raw.strip():
        return block.get("input", {})
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def finished_blocks(blocks: dict) -> list:
    """The reply's blocks in order, as the wire format's plain dicts. Thinking blocks are
    kept verbatim, signature included: endpoints want them back exactly as sent."""
    content = []
    for index in sorted(blocks):
        block = {key: value for key, value in blocks[index].items() if value is not None}
        if block["type"] == "text":
            if not block.get("text", "").strip():
                continue  # the API rejects empty text blocks
            block = {"type": "text", "text": block["text"]}
        elif block["type"] == "tool_use":
            block = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": tool_input(block)}
        content.append(block)
    return content or [{"type": "text", "text": "(no reply)"}]


def server_sent_events(chunks, idle_seconds: float):
    """(event name, data) pairs from an SSE byte stream. Pings and comment lines keep a
    connection open but are not progress: after idle_seconds with nothing else, BadReply."""
    buffer, name, data = b"", None, []
    last_news = time.monotonic()
    for chunk in chunks:
        *lines, buffer = (buffer + chunk).split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", "replace")  # a bad byte is a bad character, not a crash
            if line and not line.startswith(":"):
                field_name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field_name == "event":
                    name = value
                elif field_name == "data":
                    data.append(value)
            elif not line and (name or data):
                event = (name, "\n".join(data))
                name, data = None, []
                if event[0] != "ping" and '"type": "ping"' not in event[1] and '"type":"ping"' not in event[1]:
                    last_news = time.monotonic()
                    yield event
        if time.monotonic() - last_news > idle_seconds:  # checked after the chunk: news in it counts
            raise BadReply(f"the endpoint sent nothing but pings or comments for {idle_seconds:g}s")
    if name or data:
        yield name, "\n".join(data)


def reply_from_events(events, on_text) -> tuple:
    """(content, stop_reason, usage) from (event name, data) pairs; raises BadReply or ErrorEvent."""
    blocks, usage, stop_reason, started = {}, {}, None, False
    for name, raw in events:
        if not raw:
            continue
        try:
            data = json.loads(raw)
        except ValueError:
            raise BadReply(f"the endpoint sent an event that is not JSON: {one_line(raw, 60)}") from None
        kind = name or (data.get("type") if isinstance(data, dict) else "")
        if kind == "error":
            raise ErrorEvent(data)
        try:
            stop_reason = apply_event(kind, data, blocks, usage, on_text) or stop_reason
        except (KeyError, TypeError, AttributeError) as err:
            raise BadReply(f"the endpoint sent a malformed {kind} event ({type(err).__name__}: {err})") from None
        started = started or kind == "message_start"
    if not started:
        raise BadReply("the endpoint's reply was empty")
    if stop_reason is None:
        raise BadReply("the reply stream ended before the message was complete (the connection dropped)")
    try:
        return finished_blocks(blocks), stop_reason, usage
    except (KeyError, TypeError, AttributeError) as err:
        raise BadReply(f"the endpoint sent a malformed content block ({type(err).__name__}: {err})") from None


def reply_from_body(raw: bytes) -> tuple:
    """A whole message as JSON where a stream was asked for (some proxies answer so)."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise BadReply("the endpoint's reply was empty" if not raw.strip() else
                       f"the endpoint's reply is not JSON: {one_line(raw.decode('utf-8', 'replace'), 60)}") from None
    if isinstance(data, dict) and data.get("error"):
        raise ErrorEvent(data)
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise BadReply(f"the endpoint's reply is not a message: {one_line(json.dumps(data), 60)}")
    usage = {}
    add_usage(usage, data.get("usage"))
    try:
        return finished_blocks(dict(enumerate(data["content"]))), data.get("stop_reason") or "end_turn", usage
    except (KeyError, TypeError, AttributeError) as err:
        raise BadReply(f"the endpoint sent a malformed content block ({type(err).__name__}: {err})") from None


def stream_reply(agent, request: dict, on_text=None) -> tuple:
    """One streamed request: (content, stop_reason, usage). Text goes to on_text as it arrives."""
    idle = agent.settings.idle_timeout
    with agent.client.messages.create(**request, stream=True) as stream:
        try:
            if "json" in stream.response.headers.get("content-type", ""):
                return reply_from_body(stream.response.read())
            return reply_from_events(server_sent_events(stream.response.iter_bytes(), idle), on_text)
        except httpx2.TimeoutException:
            raise BadReply(f"the endpoint sent nothing for {idle:g}s") from None
        except httpx2.HTTPError as err:  # a dropped connection, a body that does not decode
            raise BadReply(f"the reply broke off ({err or type(err).__name__})") from None


@dataclass(frozen=True)
class Answer:
    message: dict               # the assistant message, plain dicts
    stop_reason: str
    usage: dict
    prompt_tokens: int | None   # the prompt's size by usage, None when usage could not be trusted


def send_request(agent, request: dict, sent_tokens: int, on_text=None, label: str = "waiting for the model") -> Answer:
    """One request, retried on passing failures. Raises ContextOverflow when the endpoint
    says the prompt did not fit, however it words it; other failures as they come."""
    def attempt():
        shown = []
        with Spinner(agent.spinner_to, label) as spinner:
            def show(chunk):
                spinner.stop()  # the first token replaces the spinner
                shown.append(chunk)
                on_text(chunk)
            try:
                return stream_reply(agent, request, show if on_text else None)
            except BaseException:
                if shown:  # a reply cut off mid-line: what is said next starts on a line of its own
                    on_text("\n")
                raise
    max_tokens = request["max_tokens"]
    try:
        content, stop_reason, usage = with_retries(agent, attempt)
    except (anthropic.APIStatusError, ErrorEvent) as err:
        overflow = context_overflow(err, max_tokens=max_tokens)
        if overflow:
            raise ContextOverflow(overflow, sent_tokens, max_tokens) from err
        raise
    overflow = context_overflow(stop_reason=stop_reason)
    if overflow:
        raise ContextOverflow(overflow, sent_tokens, max_tokens)
    prompt_tokens, usage = usage_prompt_tokens(agent.endpoint, usage, sent_tokens)
    record_usage(agent, usage)
    agent.endpoint.accepted(prompt_tokens or sent_tokens, max_tokens)
    return Answer({"role": "assistant", "content": content}, stop_reason, usage, prompt_tokens)


def usage_prompt_tokens(endpoint, usage: dict, estimate: int) -> tuple:
    """(the prompt's size by usage, the usage with each token counted once). The size is
    None when usage cannot be trusted, and the estimate stands.

    Anthropic's input_tokens leave out the cache reads; some endpoints (Kimi) include
    them, and adding cache_read_input_tokens there counts them twice. A reply with fewer
    input tokens than cache reads proves the first way; reads-included is believed only
    when adding them would double the size past what was sent. Either is then remembered.
    A size that is missing, zero or under half the estimate is distrusted (believing it
    could overflow the window); one over twice the estimate is kept (a tokenizer can
    count that much more, and compacting early is the safe side). /context says which."""
    uncached, read = usage.get("input_tokens", 0), usage.get("cache_read_input_tokens", 0)
    written = usage.get("cache_creation_input_tokens", 0)
    size, counted = uncached + read + written, usage
    if read and uncached < read:
        endpoint.reads_in_input = False
    elif read and endpoint.reads_in_input is not False:
        once = uncached + written
        if endpoint.reads_in_input or (size > 1.6 * estimate and abs(once - estimate) <= 0.3 * estimate):
            endpoint.reads_in_input = True
            size, counted = once, {**usage, "input_tokens": uncached - read}
    if size <= 0:
        endpoint.usage_note = "the endpoint reported no input usage on the last reply; sizes are estimates"
        return None, counted
    if size < estimate / 2:
        endpoint.usage_note = (f"usage distrusted: the endpoint reported {size:,} prompt tokens where about "
                               f"{estimate:,} were sent; sizes are estimates")
        return None, counted
    if size > estimate * 2:
        endpoint.usage_note = (f"the endpoint counts {size:,} prompt tokens where the estimate was {estimate:,}; "
                               "its count is used")
    else:
        endpoint.usage_note = "this endpoint's input_tokens include the cache reads; counted once" \
            if endpoint.reads_in_input else ""
    return size, counted


def record_usage(agent, usage: dict) -> dict:
    """Keep the last call's usage and the session's totals; return the usage as a dict."""
    figures = {key: usage.get(key, 0) for key in USAGE_KEYS}
    agent.state.last_usage = figures
    for key, value in figures.items():
        agent.usage_totals[key] = agent.usage_totals.get(key, 0) + value
    return figures


# ---- secrets -------------------------------------------------------------------------------------
# What must never reach the model, a log or a file.

# Every message is appended the moment it enters the history, and every rewrite of the
# history is recorded whole, so a crash loses at most the line being written and
# --resume can rebuild exactly what the model saw last.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^:/@\s]*:([^@/\s]{8,})@", re.IGNORECASE)


SETTINGS_NAMES = ("MODEL_ID", "ANTHROPIC_BASE_URL", "CONTEXT_WINDOW", "API_CONNECT_TIMEOUT", "API_IDLE_TIMEOUT",
                  "CACHE_TTL", "S08_HISTORY")


def secret_values(environ, dotenv_files: tuple = ()) -> list:
    """What must never reach the model, a log or a file, longest first: values of
    environment variables named like secrets; every value of 8 or more characters in the
    workspace's .env files (this program's own settings aside: a request carries the
    model's id); and the password of any user:password@host URL among all of them."""
    values = {v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= 8}
    urls = set(environ.values())  # ANTHROPIC_BASE_URL may carry a proxy's password
    for found in dotenv_files:
        values |= {v for k, v in found.items() if v and len(v) >= 8 and k not in SETTINGS_NAMES}
        urls |= {v for v in found.values() if v}
    values |= {m for v in values | urls for m in URL_PASSWORD.findall(v)}
    return sorted(values, key=len, reverse=True)


def redact_deep(value, secrets: list):
    """A request (or any JSON value) with every secret in its strings replaced. What holds
    no secret comes back as the same object, so a clean history is walked, not copied."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        items = {key: redact_deep(item, secrets) for key, item in value.items()}
        return value if all(items[key] is item for key, item in value.items()) else items
    if isinstance(value, list):
        items = [redact_deep(item, secrets) for item in value]
        return value if all(new is old for new, old in zip(items, value)) else items
    return value


def redact(text: str, secrets: list) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, "[redacted]")
    return text


# ---- the session log -----------------------------------------------------------------------------
# Every message is appended the moment it enters the history, and every rewrite of the
# history is recorded whole, so a crash loses at most the line being written and --resume
# can rebuild exactly what the model saw last.

class SessionLog:
    """An append-only JSON-lines file, flushed to disk after every record."""

    def __init__(self, path: Path, secrets: list = (), warn=print, header: dict | None = None,
                 endpoint: dict | None = None):
        self.path, self.secrets, self.warn = path, list(secrets), warn
        self.header = header  # written with the first record: a session with no messages leaves no file
        self.file = None
        self.failed = False
        self.endpoint = endpoint or (header or {}).get("endpoint")  # the endpoint facts written last

    def note_endpoint(self, facts: dict) -> None:
        """Record what was learned about the endpoint (its window, say), when it changes."""
        if facts != self.endpoint:
            self.endpoint = facts
            self.write({"type": "endpoint", **facts})

    def write(self, record: dict) -> None:
        if self.failed:
            return
        if self.header:
            header, self.header = self.header, None
            self.write(header)
            if self.failed:
                return
        line = redact(json.dumps(record, ensure_ascii=False), self.secrets)  # a last net for secrets
        try:
            if self.file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.file = open(self.path, "a", encoding="utf-8")
            self.file.write(line + "\n")
            self.file.flush()
            os.fsync(self.file.fileno())
        except OSError as err:
            self.failed = True  # say it once; the session itself goes on
            self.warn(f"[session log] cannot write {self.path} ({err}); this session will not be resumable.")


def log_records(path: Path):
    """Each line of a session log as a record: a dict, or None for a line that is not a JSON
    object (torn by a crash, or edited). Lines end at newlines only: a record may hold a
    U+2028 in its text, which str.splitlines would also split at."""
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            yield record if isinstance(record, dict) else None


def logged_endpoint(path: Path, model: str) -> dict | None:
    """The endpoint facts a session log recorded last, if it was for the same model."""
    facts, header_model = None, None
    for record in filter(None, log_records(path)):
        if record.get("type") == "session":
            header_model, facts = record.get("model"), record.get("endpoint") or facts
        elif record.get("type") == "endpoint" and record.get("model", header_model) == model:
            facts = {k: v for k, v in record.items() if k != "type"}
    return facts if facts and (facts.get("model") or header_model) == model else None


BLOCK_FIELDS = {"text": ("text",), "tool_use": ("id", "name"), "tool_result": ("tool_use_id",)}


def is_message(value) -> bool:
    """Whether a logged record holds a message the program can work with."""
    if not isinstance(value, dict) or value.get("role") not in ("user", "assistant"):
        return False
    content = value.get("content")
    return isinstance(content, str) or isinstance(content, list) and all(
        isinstance(b, dict) and all(isinstance(b.get(k), str) for k in BLOCK_FIELDS.get(b.get("type"), ("type",)))
        for b in content)


def read_session(path: Path, warn=None) -> list:
    """Replay a session log into the history it last held. A line that is not a whole,
    well-formed record (torn by a crash, or edited) is skipped, and warn() says how many."""
    history, skipped = [], 0
    for record in log_records(path):
        kind = record.get("type") if record else None
        if kind == "message" and is_message(record.get("message")):
            history.append(record["message"])
        elif kind == "replace_last" and history and is_message(record.get("message")):
            history[-1] = record["message"]
        elif kind == "history" and isinstance(record.get("messages"), list) and \
                all(is_message(m) for m in record["messages"]):
            history = record["messages"]
        elif kind == "rewrite" and (rewritten := apply_rewrite(history, record.get("parts"))) is not None:
            history = rewritten
        elif kind not in ("session", "endpoint", "layer"):
            skipped += 1
    if skipped and warn:
        warn(f"[session log] skipped {skipped} unreadable record(s) in {path.name}")
    return history


def logged_context_tokens(path: Path) -> int | None:
    """The context's size by the endpoint's usage, if the log's last change to the history
    carries it (a reply, or a resume that was measured)."""
    for record in reversed(list(filter(None, log_records(path)))):
        if record.get("type") in ("message", "replace_last", "history", "rewrite"):
            tokens = record.get("context_tokens")
            return tokens if isinstance(tokens, int) and tokens > 0 else None
    return None


def repair_torn_tail(path: Path) -> int:
    """Cut a last line the program was killed while writing, so new records start on a
    line of their own; return how many bytes were cut."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return 0
            keep = data.rfind(b"\n") + 1
            try:
                json.loads(data[keep:])
                f.write(b"\n")  # a whole record that only lost its newline is kept
                return 0
            except ValueError:
                f.truncate(keep)
    except OSError:
        return 0  # not writable: SessionLog says so when it tries to append
    return len(data) - keep


def session_logs(workdir: Path) -> list:
    """This workspace's session logs, oldest first."""
    return sorted((workdir / TRANSCRIPT_DIR).glob("session-*.jsonl"), key=lambda p: p.stat().st_mtime)


def list_sessions(workdir: Path, width: int | None = None) -> str:
    """A row a session: its id, when it last changed, its size and its first prompt. On a
    terminal narrower than a row, each session takes two lines, cut to the width."""
    rows = []
    for path in session_logs(workdir):
        history = read_session(path, warn=print)
        first = first_prompt(path)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
        prompt = one_line(first, 50) + ("" if history else " (not answered)") if first else "(no prompt yet)"
        session, size = path.stem.removeprefix("session-"), f"{path.stat().st_size / 1024:.1f} KB"
        row = f"  {session:<24} {when}  {counted(len(history), 'message'):>13}  {size:>11}  {prompt}"
        if width and display_width(row) >= width:
            rows += [cut_to_width(f"  {session}  {when}", width - 1),
                     cut_to_width(f"    {counted(len(history), 'message')}, {size}: {prompt}", width - 1)]
        else:
            rows.append(row)
    return "Sessions in this workspace (newest last):\n" + "\n".join(rows) if rows else \
        "No sessions in this workspace yet."


def first_prompt(path: Path) -> str | None:
    """What the user typed first in a session: from the log, which compaction never rewrites."""
    for record in filter(None, log_records(path)):
        if record.get("type") in ("message", "replace_last") and is_message(record.get("message")) and \
                (request := current_request([record["message"]])):
            return request["text"]
    return None


def unanswered(calls: list) -> list:
    return [{"type": "tool_result", "tool_use_id": c["id"], "is_error": True,
             "content": "Interrupted: the program stopped before this call finished."} for c in calls]


def repair_history(messages: list) -> list:
    """Make a history from a log valid for the API again, whatever the log lost: it starts
    with the user; every call is answered right after it (a call the program stopped in
    gets a result saying so); a result with no call is dropped; a tool input that is not
    an object (refused when it came) becomes {}."""
    repaired = []
    for message in messages:
        previous = repaired[-1] if repaired else None
        calls = [b for b in blocks_of(previous) if b.get("type") == "tool_use"] if has_tool_use(previous or {
            "role": "user", "content": []}) else []
        if message["role"] == "assistant":
            if previous is None:
                continue  # a history starts with the user
            if calls:
                repaired.append({"role": "user", "content": unanswered(calls)})
            repaired.append({**message, "content": [{**b, "input": {}} if b.get("type") == "tool_use" and not
                                                    isinstance(b.get("input"), dict) else b for b in blocks_of(message)]})
            continue
        ids = {c["id"] for c in calls}
        results = [b for b in blocks_of(message) if b.get("type") == "tool_result" and b["tool_use_id"] in ids]
        results += unanswered([c for c in calls if c["id"] not in {r["tool_use_id"] for r in results}])
        content = results + [b for b in blocks_of(message) if b.get("type") != "tool_result"]
        if previous is not None and previous["role"] == "user":
            repaired[-1] = {**previous, "content": blocks_of(previous) + content}  # keep the roles alternating
        elif content:
            repaired.append({**message, "content": content})
    if repaired and has_tool_use(repaired[-1]):
        repaired.append({"role": "user", "content": unanswered(
            [b for b in blocks_of(repaired[-1]) if b.get("type") == "tool_use"])})
    return repaired


def find_session(workdir: Path, wanted: str) -> Path:
    """The log of session `wanted` ("latest": the newest); ValueError when there is none."""
    logs = session_logs(workdir)
    if not logs:
        raise ValueError(f"No sessions in {workdir} yet: start one without --resume.")
    if wanted == "latest":
        return logs[-1]
    found = [path for path in logs if path.stem.removeprefix("session-").startswith(wanted)]  # a prefix will do
    if len(found) != 1:
        raise ValueError(f"{'No' if not found else 'More than one'} session {wanted!r} in {workdir / TRANSCRIPT_DIR}"
                         "; --list shows them.")
    return found[0]


def open_session(agent, resume: Path | None) -> list:
    """Start a new session log, or continue the one given; return its history."""
    if resume:
        cut = repair_torn_tail(resume)
        if cut:
            agent.say(f"[session log] its last line was cut off when the program stopped; removed it ({cut} bytes)")
        logged = read_session(resume, warn=agent.say)
        history, tokens = repair_history(logged), logged_context_tokens(resume)
        if tokens and len(history) == len(logged):  # nothing was repaired: the usage still measures it
            agent.state.tokens.anchor(tokens, history)  # so the first pass estimates nothing
        agent.log = SessionLog(resume, agent.secrets, agent.say, endpoint=agent.endpoint.facts())
        agent.log.write({"type": "history", "reason": "resumed", "messages": history,
                         **({"context_tokens": agent.state.tokens.anchor_tokens} if agent.state.tokens.anchor_tokens
                            else {})})
        agent.say(f"Resumed session {resume.stem.removeprefix('session-')}: {counted(len(history), 'message')}.")
        request, reply = current_request(history), last_reply_text(history)  # where the conversation was
        if request:
            agent.say(f"  you asked: {one_line(request['text'], 200)}", "dim", cut=True)
        if reply:
            agent.say(f"  the model: {one_line(reply, 200)}", "dim", cut=True)
        return history
    session = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    header = {"type": "session", "id": session, "model": agent.settings.model,
              "window": agent.settings.window, "workdir": str(agent.workdir), "endpoint": agent.endpoint.facts()}
    agent.log = SessionLog(agent.workdir / TRANSCRIPT_DIR / f"session-{session}.jsonl", agent.secrets,
                           agent.say, header)
    return []


# ---- the terminal and the REPL -------------------------------------------------------------------

SPINNER_FRAMES = "|/-\\"


STYLES = {"layer": "\033[36m", "tool": "\033[2m", "error": "\033[31m", "dim": "\033[2m", "title": "\033[1m"}


class Spinner:
    """A one-line "waiting…" with elapsed seconds, on a terminal only; gone when work shows up."""

    def __init__(self, stream, label: str):
        self.stream, self.label = stream, label
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True) if stream else None

    def __enter__(self) -> "Spinner":
        if self.thread:
            self.thread.start()
        return self

    def _spin(self) -> None:
        started = time.monotonic()
        for frame in iter(int, 1):  # forever, until stop()
            if self.done.wait(0.1 if frame else 0.5):  # nothing for quick work
                return
            self.stream.write(f"\r{SPINNER_FRAMES[frame % 4]} {self.label} {time.monotonic() - started:.1f}s ")
            self.stream.flush()

    def stop(self) -> None:
        if self.thread and not self.done.is_set():
            self.done.set()
            self.thread.join()
            self.stream.write("\r\033[K")  # erase the spinner line
            self.stream.flush()

    def __exit__(self, *exc) -> None:
        self.stop()


def one_line(text: str, width: int = 100) -> str:
    """Text as one line of at most width columns, cut with "…" when longer."""
    return cut_to_width(" ".join(str(text).split()), width)


def char_width(char: str) -> int:
    """Columns a character takes on a terminal: two for CJK and other wide characters."""
    if unicodedata.category(char) in ("Mn", "Me", "Cf"):  # combining marks, zero-width joiners
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def display_width(text: str) -> int:
    return len(text) if text.isascii() else sum(map(char_width, text))


def fit_prefix(text: str, width: int) -> str:
    """The longest start of text that takes at most width columns."""
    used = 0
    for index, char in enumerate(text):
        used += char_width(char)
        if used > width:
            return text[:index]
    return text


def cut_to_width(line: str, width: int) -> str:
    return line if display_width(line) <= width else fit_prefix(line, width - 1) + "…"


WIDE = "\u1100-\u115f\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
BREAKABLE = re.compile(f"[{WIDE}]|[^\\s{WIDE}]+|\\s+")  # a wide character, a word, or spaces: lines break between


def wrapped(line: str, width: int) -> list:
    """A line broken between words (or between CJK characters) into lines of at most width
    columns, the later ones indented under the first; a word wider than a line is split."""
    if display_width(line) <= width:
        return [line]
    indent = " " * min(len(line) - len(line.lstrip(" ")) + 2, width // 2)
    lines, current = [], ""
    for piece in BREAKABLE.findall(line):
        if display_width(current + piece) <= width:
            current += piece
            continue
        if current.strip():
            lines.append(current.rstrip())
            current = indent
        if piece.isspace():
            continue
        if not current.strip():  # only indentation: it gives way to the word
            current = current[:max(width - char_width(piece[0]), 0)]
        while display_width(current + piece) > width:  # a word longer than a whole line
            part = fit_prefix(piece, width - display_width(current)) or piece[0]
            lines.append(current + part)
            piece, current = piece[len(part):], indent
        current += piece
    return lines + [current.rstrip()] if current.strip() else lines


class WordWrap:
    """The model's streamed text, wrapped at word boundaries: the last word of a chunk is
    held back until the next chunk shows where it ends. Code is left as it is (inside a
    ``` fence, or on a line that starts indented): a line break inserted there would
    break what a user copies. With no width, text passes as is."""

    def __init__(self, width: int | None):
        self.width, self.column, self.word = (width - 1 if width else None), 0, ""
        self.in_code = self.indented = False

    def feed(self, chunk: str) -> str:
        if not self.width:
            return chunk
        pieces, self.word = BREAKABLE.findall(self.word + chunk), ""
        if pieces and not pieces[-1].isspace() and not re.fullmatch(f"[{WIDE}]", pieces[-1]):
            self.word = pieces.pop()  # a word: it may go on in the next chunk
        return "".join(map(self.place, pieces))

    def finish(self) -> str:
        """What is still held back; the line is then complete."""
        rest = self.place(self.word) if self.word else ""
        self.word, self.column, self.in_code, self.indented = "", 0, False, False
        return rest

    def place(self, piece: str) -> str:
        if "\n" in piece:  # a new line starts after it
            tail = piece.rsplit("\n", 1)[1]
            self.column, self.indented = display_width(tail), bool(tail)
            return piece
        if self.column == 0:
            self.indented = self.indented or piece.isspace()
            if piece.startswith("```"):
                self.in_code = not self.in_code
        width = display_width(piece)
        if self.in_code or self.indented or self.column + width <= self.width or self.column == 0:
            self.column += width  # (code, or a word longer than a line: the terminal folds it)
            return piece
        self.column = 0
        return "\n" if piece.isspace() else "\n" + self.place(piece)


def counted(n: int, noun: str) -> str:
    """"1 message", "2 messages"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def format_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if abs(n) >= 1000 else str(n)


HELP = """Commands:
  /compact [focus]  summarize the conversation now; the focus text steers the summary
  /context          what fills the context, and how close it is to auto-compact
  /clear            start a new conversation (the session log keeps the old one)
  /help             this text
  /exit, q          leave (so do /quit, exit, quit, Ctrl-D and Ctrl-C twice)
Ctrl-C stops the model or a tool and returns here; the conversation is kept.
A paste of several lines is one message; so is a block typed between two lines of \"\"\".
Run with --list to see this folder's sessions, --resume [ID] to continue one."""


def add_user_text(messages: list, text: str) -> bool:
    """Append the user's words; after an interruption they join the pending user message
    (True then), so roles keep alternating."""
    if messages and messages[-1]["role"] == "user":
        messages[-1] = with_text(messages[-1], text)
        return True
    messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
    return False


def billed_input(usage: dict, ttl: str = "5m") -> float:
    """Input tokens as the price list sees them: cache reads 0.1×, cache writes 1.25× (2× for an hour)."""
    return (usage.get("input_tokens", 0) + (2.0 if ttl == "1h" else 1.25) * usage.get("cache_creation_input_tokens", 0)
            + 0.1 * usage.get("cache_read_input_tokens", 0))


def context_parts(agent, messages: list, total: int) -> dict:
    """What fills the context, by kind, in tokens that add up to total: the split between
    kinds is estimated, the total is the counter's (exact up to the last response)."""
    estimated = {"system prompt + tools": agent.overhead, "user text": 0, "assistant text": 0,
                 "tool calls": 0, "tool results": 0}
    for message in messages:
        for block in blocks_of(message):
            kind = {"text": f"{message['role']} text", "tool_use": "tool calls"}.get(block.get("type"), "tool results")
            estimated[kind] += estimate_text_tokens(json.dumps(block, ensure_ascii=False))
    scale = total / max(sum(estimated.values()), 1)
    parts = {kind: int(n * scale) for kind, n in estimated.items()}
    parts[max(parts, key=parts.get)] += total - sum(parts.values())  # the rounding goes to the largest
    return parts


def bar(tokens: int, window: int, width: int = 20) -> str:
    filled = min(width, round(width * tokens / max(window, 1)))
    return "█" * filled + "░" * (width - filled)


def context_report(agent, messages: list) -> str:
    """What /context prints: what fills the window, part by part, so the parts add up to
    it; then the thresholds, the cache and the savings."""
    s = agent.settings
    total = context_tokens(agent, messages)
    how = "exact up to the last response, split by estimate" if agent.state.tokens.anchor_tokens else "estimated"
    rows = {**context_parts(agent, messages, total), "free until auto-compact": max(s.threshold - total, 0),
            "reserved: output + buffer": max(s.window - max(total, s.threshold), 0)}
    lines = [f"Context: {counted(len(messages), 'message')}, {total:,} tokens of a {s.window:,}-token window "
             f"({100 * total / s.window:.0f}%; {how})"]
    bar_width = min(20, (agent.columns() or 80) - 45)  # on a narrow terminal the bar gives way first
    for name, n in rows.items():
        drawn = f"  {bar(n, s.window, bar_width)}" if bar_width >= 4 else ""
        lines.append(f"  {name:<26}{n:>9,}{drawn} {100 * n / s.window:>3.0f}%")
    endpoint = agent.endpoint
    lines.append(f"Window: {s.window:,} tokens, from {endpoint.window_source}"
                 + ("; the endpoint counts max_tokens against it" if endpoint.counts_output else ""))
    if endpoint.usage_note:
        lines.append(f"Usage: {endpoint.usage_note}")
    lines.append(f"Auto-compact above {format_tokens(s.threshold)} tokens (window − {format_tokens(s.max_output)} "
                 f"output − {format_tokens(s.window - s.max_output - s.threshold)} buffer)")
    lines.append(f"Cheap layers: tool results ≤ {s.budget_chars:,} chars a message; above "
                 f"{format_tokens(s.micro_trigger)} tokens, snip past {s.snip_keep_head + s.snip_keep_tail} messages "
                 f"({s.snip_at_least}+ at a time) and micro_compact (clearing {format_tokens(s.clear_at_least)}+, "
                 f"keeping the newest {s.keep_recent})")
    last = agent.state.last_usage
    if last:
        sent = last["input_tokens"] + last["cache_read_input_tokens"] + last["cache_creation_input_tokens"]
        lines.append(f"Prompt cache, last request: {100 * last['cache_read_input_tokens'] // max(sent, 1)}% read "
                     f"({format_tokens(last['cache_read_input_tokens'])} read, "
                     f"{format_tokens(last['cache_creation_input_tokens'])} written, "
                     f"{format_tokens(last['input_tokens'])} uncached)")
        totals = agent.usage_totals
        raw = totals["input_tokens"] + totals["cache_read_input_tokens"] + totals["cache_creation_input_tokens"]
        billed = int(billed_input(totals, s.cache_ttl))
        lines.append(f"Session input: {format_tokens(raw)} tokens sent, billed as {format_tokens(billed)}")
    lines.append("Saved so far:")
    lines += [f"  {name:<20}{agent.stats.get(name, {}).get('runs', 0):>4}×  "
              f"−{format_tokens(agent.stats.get(name, {}).get('saved', 0))}" for name in LAYER_VERBS]
    return "\n".join(lines)


def status_line(agent, messages: list) -> str:
    s = agent.settings
    used = context_tokens(agent, messages)
    left = s.threshold - used
    return (f"context {format_tokens(used)}/{format_tokens(s.window)} tokens ({100 * used / s.window:.0f}%) · "
            + (f"auto-compact in {format_tokens(left)}" if left > 0 else "over the auto-compact threshold: "
               "it compacts before the next call"))


def handle_command(agent, messages: list, line: str) -> None:
    command, _, argument = line.partition(" ")
    if command == "/help":
        agent.say(HELP)
    elif command == "/context":
        agent.say(context_report(agent, messages))
    elif command == "/compact":
        if not messages:
            agent.say("Nothing to compact yet.")
            return
        replace_history(agent, messages, summarize_history(agent, messages, focus=argument.strip()), "/compact")
    elif command == "/clear":
        replace_history(agent, messages, [], "/clear")
        agent.state = LoopState()  # nothing read, no todos, no size anchor: a new conversation
        agent.say("(A new conversation. The session log keeps the old one: --resume cannot bring it back, "
                  "but .transcripts/ has every message.)")
    else:
        agent.say(f"Unknown command {command}. Type /help for the list.")


def park_long_prompt(agent, prompt: str) -> str | None:
    """A message too big to send is saved to a file, and the model is asked to read it."""
    tokens = estimate_text_tokens(prompt)
    try:
        path = save_tool_output(agent.workdir / ".task_outputs" / "prompts", f"prompt-{uuid.uuid4().hex[:8]}", prompt)
    except OSError as err:
        agent.say(f"Your message is about {tokens:,} tokens, more than half the context window allows, and it "
                  f"could not be saved to a file ({err}). It was not sent: put it in a file and ask me to read it.")
        return None
    agent.say(f"(Your message is about {tokens:,} tokens, too big to send whole; it was saved to "
              f"{path.relative_to(agent.workdir)} and the model will read it from there.)")
    return (f"My message is too long to send whole (about {tokens:,} tokens). It is saved at "
            f"{path.relative_to(agent.workdir)}: read it in parts with read_file and do what it asks.")


def take_turn(agent, messages: list, prompt: str) -> bool:
    """One user turn, start to end; False when it ended in an API error."""
    prompt = redact(prompt, agent.secrets)  # before any hook: the ledger quotes prompts verbatim
    blocked = [r["block"] for r in fire_hooks(agent, "UserPromptSubmit", prompt=prompt) if "block" in r]
    if blocked:
        agent.say(f"(prompt blocked by a hook: {blocked[0]})")
        return True
    if estimate_text_tokens(prompt) > agent.settings.threshold // 2:
        prompt = park_long_prompt(agent, prompt)
        if prompt is None:
            return True
    merged = add_user_text(messages, prompt)
    asked = blocks_of(messages[-1])[-1]  # this very block is withdrawn if the model never answers it
    if agent.log:
        agent.log.write({"type": "replace_last" if merged else "message", "message": messages[-1]})
    try:
        agent_loop(agent, messages)
        if agent.show_status:
            agent.say(status_line(agent, messages), "dim")
        return True
    except ContextOverflow as err:
        agent.say(f"API error: {err}, even after compacting. The conversation is kept: try /compact, "
                  "or set CONTEXT_WINDOW lower.", "error")
    except api_failures() as err:
        withdrawn = withdraw_unanswered_prompt(agent, messages, asked)
        agent.say(" ".join(filter(None, [f"API error: {api_error_text(err)}.", what_to_do(err),
                                         what_became_of_it(err, withdrawn, agent.fit_width)])), "error")
    return False


def what_to_do(err: Exception) -> str:
    status = getattr(err, "status_code", None)
    if status in (401, 403):
        return "Check ANTHROPIC_API_KEY, or ANTHROPIC_AUTH_TOKEN for an endpoint that wants a bearer token."
    if status == 404:
        return "Check MODEL_ID and ANTHROPIC_BASE_URL."
    return ""


def what_became_of_it(err: Exception, withdrawn: bool, terminal: bool) -> str:
    """What happened to the user's message after an API error, and whether to send it again."""
    if not withdrawn:
        return "The work so far is kept; send a message to go on."
    if getattr(err, "status_code", None) in (400, 413, 422):  # the request itself was refused
        return ("The endpoint refused the request as it stands, so your message was taken back out; sent "
                "unchanged, it would fail again.")
    return "Your message was not answered and was taken back out; send it again" + \
        (" (the up arrow recalls it)." if terminal else ".")


def withdraw_unanswered_prompt(agent, messages: list, asked: dict) -> bool:
    """A prompt the model never answered is taken back out, so sending it again does not
    send it twice; the session log keeps a record of it. Only that block goes: a summary
    it was merged into, or anything else, stays."""
    if not messages or not any(block is asked for block in blocks_of(messages[-1])):
        return False
    rest = [block for block in blocks_of(messages[-1]) if block is not asked]
    new = messages[:-1] + ([{**messages[-1], "content": rest}] if rest else [])
    replace_history(agent, messages, new, "prompt not answered (API error)")
    return True


def read_line(interactive: bool, prompt: str = "s08 >> ") -> str | None:
    if interactive:
        return input(prompt)
    line = sys.stdin.readline()
    return line.removesuffix("\n") if line else None


def read_message(interactive: bool) -> str | None:
    """One message: a line, or several. A paste arrives whole where the terminal marks
    pastes (bracketed paste, start_repl turns it on). Elsewhere a line of three double
    quotes starts a block that the next such line ends, and a line ending in a backslash
    goes on to the next."""
    readline = sys.modules.get("readline") if interactive else None
    first = readline.get_current_history_length() if readline else 0
    line = read_line(interactive)
    if line is not None and line.strip() == '"""':
        block = []
        while (more := read_more(interactive)) is not None and more.strip() != '"""':
            block.append(more)
        line = "\n".join(block)
    else:
        while line is not None and line.endswith("\\"):
            more = read_more(interactive)
            line = line[:-1] + ("" if more is None else "\n" + more)
            if more is None:
                break
    if readline and readline.get_current_history_length() > first + 1:  # one entry for the message, not a line each
        for index in reversed(range(first, readline.get_current_history_length())):
            readline.remove_history_item(index)
        readline.add_history(line)
    return line


def read_more(interactive: bool) -> str | None:
    """The next line of a message of several lines; None at the end of input (Ctrl-D ends the message)."""
    try:
        return read_line(interactive, "... ")
    except EOFError:
        return None


def repl(agent, interactive: bool, messages: list) -> int:
    """Read and run lines until the end; the exit code. Piped input ends with 1 if a turn
    ended in an API error, so a script can tell."""
    interrupts, failed = 0, False
    while True:
        try:
            line = read_message(interactive)
        except EOFError:
            line = None
            if interactive and "readline" not in sys.modules:
                agent.out("")  # end the prompt's line (readline does it itself), so the shell's prompt starts on its own
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 2:
                line = None
                agent.out("")
            else:
                agent.say("\n(press Ctrl-C again, or type q, to quit)")
                continue
        if line is None or line.strip() in ("q", "exit", "quit", "/exit", "/quit"):
            return 1 if failed and not interactive else 0
        interrupts = 0
        line = line.strip()
        if not line:
            continue
        try:
            if line.startswith("/"):
                handle_command(agent, messages, line)
            elif not take_turn(agent, messages, line):
                failed = True
        except KeyboardInterrupt as stop:  # a layer only replaces history when done, so it is intact
            record_interruption(agent, messages, getattr(stop, "partial", ""))
            agent.say("\n(interrupted; the conversation is kept, type your next message)")


def terminal_confirm(interactive: bool):
    def confirm(question: str) -> tuple:
        if not interactive:
            return False, "no one could confirm it (standard input is not a terminal)"
        try:  # Ctrl-C here cancels the turn, as anywhere else (use_tools answers the call as interrupted)
            answer = input(f"{question} [y/N] ").strip().lower()
        except EOFError:
            answer = ""
        return (True, "") if answer in ("y", "yes") else (False, "the user said no")
    return confirm


# ---- configuration and start-up ------------------------------------------------------------------

SETUP_HELP = """{problem}
Copy .env.example to .env and fill in MODEL_ID and either ANTHROPIC_API_KEY or
ANTHROPIC_AUTH_TOKEN (a token sent as "Authorization: Bearer", as proxies such
as OpenRouter want), plus ANTHROPIC_BASE_URL for an Anthropic-compatible
endpoint; or export them in your shell. See README.md, section "Set up"."""


# Windows of well-known models, for endpoints without the Models API (none of the
# compatible providers has one). First match wins; the id may carry a provider prefix.
KNOWN_WINDOWS = [  # (pattern, window, what it matches)
    (r"claude-", 200_000, "claude-*"),              # Anthropic models overview: 200k (1M only behind a beta header)
    (r"deepseek-", 131_072, "deepseek-*"),          # DeepSeek API docs: deepseek-chat / deepseek-reasoner, 128K
    (r"kimi-k2-0711", 131_072, "kimi-k2-0711"),     # Moonshot docs: the first Kimi K2 release, 128K
    (r"kimi-k2", 262_144, "kimi-k2*"),              # Moonshot docs: kimi-k2-0905, k2-turbo, k2.5, 256K
    (r"glm-4\.5", 128_000, "glm-4.5*"),             # Z.ai docs: GLM-4.5, 128K
    (r"glm-(4\.[6-9]|5)", 200_000, "glm-4.6 and later"),  # Z.ai docs: GLM-4.6 and later, 200K
    (r"minimax-m2", 204_800, "MiniMax-M2*"),        # MiniMax docs: MiniMax-M2 to M2.7, 204,800
]


def dotenv_paths() -> list:
    return [Path.cwd() / ".env", Path(__file__).resolve().parent.parent / ".env"]


def load_configuration() -> None:
    from dotenv import load_dotenv  # imported here so that importing this file does no work
    for path in dotenv_paths():
        load_dotenv(path)


def dotenv_files() -> tuple:
    """The values in the .env files of the working folder and the repository root."""
    from dotenv import dotenv_values
    return tuple(dotenv_values(path) for path in dotenv_paths() if path.is_file())


def seconds_setting(name: str, default: float) -> float:
    value = os.getenv(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1
    if not 0 < seconds <= 3600:
        raise ValueError(f"{name}={value!r} must be a number of seconds between 0 and 3600.")
    return seconds


def ttl_setting() -> str:
    ttl = os.getenv("CACHE_TTL", "5m").strip() or "5m"
    if ttl not in CACHE_TTLS:
        raise ValueError(f"CACHE_TTL={ttl!r} must be 5m or 1h.")
    return ttl


def known_window(model: str) -> tuple | None:
    """(window, what the table's row matches) for a well-known model id, else None."""
    for pattern, window, label in KNOWN_WINDOWS:
        if re.search(pattern, model, re.IGNORECASE):
            return window, label
    return None


def models_api_window(client, model: str, endpoint: Endpoint) -> int | None:
    """max_input_tokens from the Models API; a 404 is remembered (most compatible endpoints)."""
    if not endpoint.models_api:
        return None
    try:
        info = client.with_options(max_retries=0, timeout=10).models.retrieve(model)  # start-up stays quick
    except anthropic.NotFoundError:
        endpoint.models_api = False
        return None
    except (anthropic.AuthenticationError, anthropic.PermissionDeniedError, anthropic.APIConnectionError) as err:
        endpoint.startup_problem = f"{api_error_text(err)}. {what_to_do(err)}".strip()  # said before the prompt
        return None
    except anthropic.APIError:
        return None
    window = getattr(info, "max_input_tokens", None)
    return window if isinstance(window, int) and window >= MIN_CONTEXT_WINDOW else None


DEFAULT_WINDOW_SOURCE = "the default (nothing else said; set CONTEXT_WINDOW if you know it)"


def discover_endpoint(client, model: str, logged: dict | None = None) -> Endpoint:
    """The window, from CONTEXT_WINDOW, else the Models API, else the table of well-known
    models, else 200,000. A window a resumed session learned from an overflow caps the
    last three."""
    logged = logged or {}
    endpoint = Endpoint(DEFAULT_CONTEXT_WINDOW, DEFAULT_WINDOW_SOURCE, model=model,
                        counts_output=bool(logged.get("counts_output")),
                        can_count_tokens=logged.get("count_tokens", True) is not False,
                        models_api=logged.get("models_api", True) is not False)
    configured = os.getenv("CONTEXT_WINDOW", "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < MIN_CONTEXT_WINDOW:
            raise ValueError(f"CONTEXT_WINDOW={configured!r} must be a whole number of tokens, "
                             f"at least {MIN_CONTEXT_WINDOW}.")
        endpoint.window, endpoint.window_source = int(configured), "CONTEXT_WINDOW"
    elif window := models_api_window(client, model, endpoint):
        endpoint.window, endpoint.window_source = window, "the Models API (max_input_tokens)"
    elif row := known_window(model):
        endpoint.window, endpoint.window_source = row[0], f"the built-in table of known models ({row[1]})"
    learned = logged.get("window")  # CONTEXT_WINDOW, set by the user, may correct a learned window
    if logged.get("learned") and not configured and isinstance(learned, int) and \
            MIN_CONTEXT_WINDOW <= learned < endpoint.window:
        endpoint.window, endpoint.learned = learned, True
        endpoint.window_source = str(logged.get("window_source") or "an overflow earlier in this session")
    return endpoint


def make_client(connect: float, idle: float):
    """The SDK client. A token wins over a key: a proxy that asks for a token must never be
    sent the Anthropic key that happens to be in the shell. Retries are ours, so each one
    can be seen (with_retries)."""
    token = os.getenv("ANTHROPIC_AUTH_TOKEN")
    credential = {"auth_token": token} if token else {"api_key": os.environ["ANTHROPIC_API_KEY"]}
    if token and os.getenv("ANTHROPIC_API_KEY"):
        print("Using ANTHROPIC_AUTH_TOKEN; ANTHROPIC_API_KEY is set too and is not sent.", file=sys.stderr)
    return anthropic.Anthropic(**credential, max_retries=0, timeout=anthropic.Timeout(idle, connect=connect))


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description="s08: a coding agent with context compaction. "
                                     "Run it in the folder the agent should work in.",
                                     epilog="Configuration (environment or .env): MODEL_ID, ANTHROPIC_API_KEY or "
                                     "ANTHROPIC_AUTH_TOKEN, and optionally ANTHROPIC_BASE_URL, CONTEXT_WINDOW, "
                                     "API_CONNECT_TIMEOUT, API_IDLE_TIMEOUT, CACHE_TTL, S08_HISTORY. At the prompt, "
                                     "/help lists the commands. README.md has the rest.")
    parser.add_argument("--resume", nargs="?", const="latest", metavar="ID",
                        help="continue the most recent session in this folder, or session ID")
    parser.add_argument("--list", action="store_true", help="list this folder's sessions and exit")
    parser.add_argument("--demo", action="store_true",
                        help="watch every layer fire, offline: a scripted model, no API key needed")
    parser.add_argument("--no-pause", action="store_true", help="with --demo: do not wait for Enter between steps")
    return parser.parse_args(argv)


INSTALL_HELP = """This Python lacks {missing}, which the program needs:
    {python}
Install them in a virtual environment beside the program:
    cd {root}
    {make_venv}. .venv/bin/activate
    python -m pip install -r requirements.txt
Then run the program with that Python (on Windows: .venv\\Scripts\\activate).
See README.md, section "Set up"."""


def missing_requirements() -> list:
    return [package for package, module in (("anthropic", "anthropic"), ("python-dotenv", "dotenv"))
            if importlib.util.find_spec(module) is None]


def main(argv=None) -> int:
    args = parse_arguments(argv)
    if (args.demo or not args.list) and (missing := missing_requirements()):
        root = Path(__file__).resolve().parent.parent
        print(INSTALL_HELP.format(python=sys.executable, missing=" and ".join(missing), root=root,
                                  make_venv="" if (root / ".venv").is_dir() else "python3 -m venv .venv && "),
              file=sys.stderr)
        return 2
    if args.demo:
        import demo  # the scripted demo lives beside this file, outside the lesson
        return demo.run(sys.modules[__name__], pause=sys.stdin.isatty() and not args.no_pause)
    if args.list:
        print(list_sessions(Path.cwd(), shutil.get_terminal_size().columns if sys.stdout.isatty() else None))
        return 0
    load_configuration()
    warnings.showwarning = lambda message, *_: print(f"[warning] {str(message).splitlines()[0]}", file=sys.stderr)
    missing = ([] if os.getenv("ANTHROPIC_API_KEY") or os.getenv("ANTHROPIC_AUTH_TOKEN") else
               ["Neither ANTHROPIC_API_KEY nor ANTHROPIC_AUTH_TOKEN is set."]) + \
        ([] if os.getenv("MODEL_ID") else ["MODEL_ID is not set."])
    if missing:
        print(SETUP_HELP.format(problem=" ".join(missing)), file=sys.stderr)
        return 2
    model, workdir = os.environ["MODEL_ID"], Path.cwd()
    try:
        resume = find_session(workdir, args.resume) if args.resume else None
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        idle = seconds_setting("API_IDLE_TIMEOUT", IDLE_TIMEOUT)
        client = make_client(seconds_setting("API_CONNECT_TIMEOUT", CONNECT_TIMEOUT), idle)
        endpoint = discover_endpoint(client, model, logged_endpoint(resume, model) if resume else None)
        ttl = ttl_setting()
    except ValueError as err:
        print(f"{err} Set it in .env or in your shell (README.md, section Configuration).", file=sys.stderr)
        return 2
    settings = replace(Settings.for_window(model, endpoint.window), idle_timeout=idle, cache_ttl=ttl)
    skills = discover_skills([workdir / "skills", Path(__file__).resolve().parent / "skills"])
    interactive = sys.stdin.isatty()
    sys.stdout.reconfigure(line_buffering=True, errors="replace")  # line by line; never dies on a character
    sys.stdin.reconfigure(errors="replace")  # bytes that are not UTF-8 must not end the session
    agent = Agent(client=client, settings=settings, workdir=workdir, tools=TOOLS, skills=skills,
                  system=build_system_prompt(workdir, skills), confirm=terminal_confirm(interactive),
                  show_status=sys.stdout.isatty(), secrets=secret_values(os.environ, dotenv_files()), endpoint=endpoint,
                  color=sys.stdout.isatty() and not os.getenv("NO_COLOR"), fit_width=sys.stdout.isatty(),
                  spinner_to=sys.stdout if sys.stdout.isatty() else None)
    install_default_hooks(agent)
    messages = open_session(agent, resume)
    say_what_start_up_found(agent)
    return start_repl(agent, interactive, messages)


def say_what_start_up_found(agent) -> None:
    endpoint = agent.endpoint
    if endpoint.startup_problem:
        agent.say(f"[endpoint] {endpoint.startup_problem} The first message will fail the same way until "
                  "this is fixed.", "error")
    if endpoint.window_source == DEFAULT_WINDOW_SOURCE:
        agent.say(f"[window] nothing says how big {endpoint.model}'s window is; assuming {endpoint.window:,} "
                  "tokens. Set CONTEXT_WINDOW if you know it; otherwise the endpoint's first \"too long\" "
                  "answer will tell.")


def history_file() -> Path | None:
    """Where the prompts typed are kept between runs (the up arrow finds them): ~/.s08_history,
    or the file S08_HISTORY names; S08_HISTORY=off keeps none."""
    setting = os.getenv("S08_HISTORY", "").strip()
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    try:
        return Path(setting).expanduser() if setting else Path.home() / ".s08_history"
    except RuntimeError:  # no home directory to expand: keep no history rather than fail
        return None


def start_repl(agent, interactive: bool, messages: list) -> int:
    if not interactive:
        return repl(agent, interactive, messages)
    try:
        import readline  # arrow keys, history and whole pastes at the prompt
    except ImportError:  # Windows has no readline: a plain prompt
        return repl(agent, interactive, messages)
    readline.parse_and_bind("set enable-bracketed-paste on")  # a paste of many lines is one message
    readline.parse_and_bind("set enable-active-region off")  # ...without showing it in reverse video
    path = history_file()
    try:
        if path and path.is_file():
            readline.read_history_file(path)
    except OSError as err:
        agent.say(f"[history] cannot read {path} ({err}); set S08_HISTORY=off to keep none.")
    agent.say(f"s08 context compact · {agent.settings.model} · window {agent.settings.window:,} tokens · "
              f"workspace {agent.workdir}\nType /help for commands, q to quit.")
    try:
        return repl(agent, interactive, messages)
    finally:
        if path:
            save_history(readline, path, agent.secrets)


def save_history(readline, path: Path, secrets: list) -> None:
    """Keep the last 1,000 one-line prompts, with any secret redacted and the file readable by its
    owner only."""
    for index in reversed(range(readline.get_current_history_length())):
        item = readline.get_history_item(index + 1) or ""
        if "\n" in item:  # the file holds a line an entry: a paste of several lines would come back in pieces
            readline.remove_history_item(index)
        elif redact(item, secrets) != item:
            readline.replace_history_item(index, redact(item, secrets))
    readline.set_history_length(1000)
    try:
        readline.write_history_file(path)
        path.chmod(0o600)
    except OSError:
        pass  # a read-only home: the session itself is saved in .transcripts/


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the prompt is up (or at the demo's pause): leave quietly
        print(file=sys.stderr)  # ...and let the shell's prompt start on a line of its own
        sys.exit(130)
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say, and no one to say it to
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        sys.exit(141)  # 128 + SIGPIPE, as a shell command would
