"""The prompt cache's marks. The API caches the prompt prefix up to each block marked with
cache_control (tools, then system, then messages): a cache read costs 0.1x an input token, a
cache write 1.25x (2x for the hour). Marks go on copies: the history itself never holds them.

Machinery the chapter does not need. It marks copies of the messages and sends nothing:
model_calls.py, beside it, sends the request. CACHE_TTLS says how long a prefix lives after
its last read, so a longer pause means the cache is gone.
"""

from ..basics import definitions
from ..messages import OWN, blocks_of, sendable, tool_results, with_text

# the API's prompt cache forgets a prefix unread this long (CACHE_TTL=1h: an hour)
CACHE_LIFETIME_SECONDS = 300
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
    results = [i for (i, _), b in tool_results(messages).items() if b.get(OWN) != "placeholder"]
    clearable = results[:-keep_recent] if keep_recent else results
    return clearable[0] - 1 if clearable and clearable[0] > 0 else None



def with_cache_breakpoints(messages: list, keep_recent: int, mark: dict = EPHEMERAL) -> list:
    """Mark the newest message, and the one the previous request ended on (two back), so
    the next request reads everything up to here from the cache; and the clearing point,
    so that after a clearing the unchanged prefix before it is still read. With the last
    tool's mark that makes four, the API's limit."""
    marked = list(messages)
    wanted = {len(messages) - 1, len(messages) - 3, clearing_point(messages, keep_recent)}
    for index in wanted - {-1, -2, -3, None}:
        marked[index] = mark_last_block(marked[index], mark)
    return marked


def marked_request(model: str, max_tokens: int, system: str, tools: dict, messages: list, *,
                   keep_recent: int, ttl: str, extra_text: str | None = None) -> dict:
    """The Messages API request for a history, cache marks placed (on copies), with
    `extra_text` added to the last user message (or as one after the last reply)."""
    # The system prompt goes as a plain string (some servers take nothing else), so the fixed
    # prefix's mark sits on the last tool; the marks on the messages cache the system prompt
    # with them.
    mark, tools = cache_mark(ttl), definitions(tools)
    tools = tools[:-1] + [{**tools[-1], "cache_control": mark}] if tools else []
    sent = with_cache_breakpoints([sendable(m) for m in messages], keep_recent, mark)
    if extra_text and sent and sent[-1]["role"] == "user":
        sent[-1] = with_text(sent[-1], extra_text)
    elif extra_text:
        sent.append({"role": "user", "content": [{"type": "text", "text": extra_text}]})
    return {"model": model, "max_tokens": max_tokens, "system": system, "tools": tools,
            "messages": sent}
