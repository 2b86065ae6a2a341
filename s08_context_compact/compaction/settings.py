"""Settings: every "too big" the layers use, derived from one number, the context window in
tokens (the window comes from the endpoint: CONTEXT_WINDOW, the Models API or a table of
known models). The numbers here are the chapter's defaults, and the ceilings the derived
values never exceed; the chapter's table gives each rule at a 200,000 and a 12,000 window.

Machinery the chapter does not need to show. Settings.for_window derives every size from a
window, and Settings.resized derives them again when the endpoint reveals a smaller one;
learning the window is the endpoint's job.
"""

from dataclasses import MISSING, dataclass, fields, replace

from ..endpoint import API_RETRIES, CACHE_TTLS, IDLE_TIMEOUT, RETRY_BASE_SECONDS
from ..messages import CHARS_PER_TOKEN

MAX_OUTPUT_TOKENS = 8_192           # asked for on every call, so reserved out of the window
AUTOCOMPACT_BUFFER_TOKENS = 13_000  # headroom for the estimate's error before the API's hard wall
# tool_result_budget
TOOL_RESULT_BUDGET_CHARS = 200_000  # chapter: tool output allowed in one message
TOOL_RESULT_BUDGET_SHARE = 0.15     # ...never more than this share of the usable context (a result
                                    # kept whole is soon cleared, and clearing rewrites the cache)
PREVIEW_CHARS = 2_000               # at most this much of a result sent to disk stays in context
# snip_compact
SNIP_KEEP_HEAD = 3                  # the first request and its setup stay visible
SNIP_KEEP_TAIL = 47                 # current work; head + tail = 50 messages before snipping
SNIP_AT_LEAST = 20                  # a snip rewrites the cache after the head: make it worth it...
SNIP_FREES_AT_LEAST_SHARE = 0.25    # ...cut at least 20 messages and this share of the threshold
# micro_compact
KEEP_RECENT_TOOL_RESULTS = 3        # micro_compact leaves the newest results alone
MICRO_COMPACT_MIN_CHARS = 120       # a placeholder is no shorter than this: skip smaller results
MICRO_TRIGGER_SHARE = 0.7           # snip and micro act only above this share of the threshold...
CLEAR_AT_LEAST_SHARE = 0.25         # ...and only if they free at least this share (cache-aware)
# compact_history: the summary, and what comes back after it
SUMMARY_MAX_TOKENS = 20_000         # ceiling for the summary's own output
SUMMARY_AHEAD_SHARES = (0.6, 0.95)  # a summary starts in the background between these shares
POST_COMPACT_SHARE = 0.25           # the compacted context must come to less than this share
POST_COMPACT_TOKENS_PER_FILE = 5_000  # files read most recently come back: this much of each...
POST_COMPACT_FILES_TOKENS = 50_000  # ...and this much in all
POST_COMPACT_USER_TOKENS = 5_000    # recent user messages restored verbatim, newest first
LEDGER_TOKENS = 2_000               # the fact ledger re-injected after compaction


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
    api_retries: int = API_RETRIES  # API_RETRIES: of a call that may pass on its own
    idle_timeout: float = IDLE_TIMEOUT  # seconds a stream may send nothing before it is abandoned
    # the prompt cache's life: "5m", or "1h" (writes cost 2×, not 1.25×)
    cache_ttl: str = "5m"
    compact_at: float = 0.0     # COMPACT_AT: the threshold as a share of the window, if lower
    summary_ahead: tuple | None = SUMMARY_AHEAD_SHARES  # SUMMARY_AHEAD: the early mark, or None
    # a pass that starts a summary of what snip cut waits for it (snip_summaries.py), so each
    # run of the demo, the tests and the scripted benchmark goes the same way; never a user's
    snip_summary_waits: bool = False

    @classmethod
    def for_window(cls, model: str, window: int, compact_at: float = 0.0) -> "Settings":
        max_output = min(MAX_OUTPUT_TOKENS, window // 4)
        buffer = min(AUTOCOMPACT_BUFFER_TOKENS, window // 10)
        threshold = min(window - max_output - buffer, int(window * compact_at) or window)
        usable_chars = threshold * TOOL_RESULT_BUDGET_SHARE * CHARS_PER_TOKEN
        budget = min(TOOL_RESULT_BUDGET_CHARS, int(usable_chars))
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
                   ledger_tokens=min(LEDGER_TOKENS, window // 50))

    def resized(self, window: int) -> "Settings":
        """The same settings for another window (one the endpoint revealed), overrides kept."""
        if window == self.window:
            return self
        set_here = [f.name for f in fields(self) if f.default is not MISSING]
        overrides = {name: getattr(self, name) for name in set_here}
        return replace(Settings.for_window(self.model, window, self.compact_at), **overrides)

    @property
    def cache_seconds(self) -> int:
        """How long the endpoint keeps a prompt prefix cached after its last read."""
        return CACHE_TTLS[self.cache_ttl]
