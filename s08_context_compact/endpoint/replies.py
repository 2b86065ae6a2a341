"""What a reply is made of: a stream's events (or a whole JSON body) folded into the
assistant message's blocks, its stop_reason and its usage, and what is wrong with a reply
that cannot be taken as an answer.

Compatible servers and the proxies in front of them bend the wire format: a failure
inside the server arrives as a 200 with no content and no usage; one tool call streamed
in pieces arrives as several tool_use blocks that share an id. Both are recognised here,
where the reply is assembled.

Machinery the chapter does not need. It folds what arrived into a finished message and says
what is wrong with one that is no answer; receiving the stream, and trying again after a
BadReply, is model_calls.py's job, beside it. extract_summary keeps what a summary reply
holds, and SummaryError is how a summary with nothing usable fails.
"""

import json
import re

from ..messages import NO_REPLY, OWN, own_text
from .overflow import is_token_count
from ..basics import HALF_ESCAPE, one_line, shown_so_far, well_formed, well_formed_deep


class BadReply(Exception):
    """A reply that broke off or could not be read: a dropped or silent stream, an event
    that is not JSON, an empty body. Another try may well get a good one."""


class EmptyReply(BadReply):
    """A 200 that says nothing: no content and no usage. Not an answer but a failure the
    server kept to itself (LiteLLM sends this when llama.cpp behind it failed, a prompt
    over its context size among the causes)."""

    def __init__(self):
        super().__init__("the endpoint answered with nothing (no content, no usage): "
                         "the server behind it failed")


class ErrorEvent(Exception):
    """An error the endpoint sent inside a 200 stream. Like the SDK's errors it has
    status_code and body, so context_overflow and api_error_text read it the same way."""

    def __init__(self, body):
        error = (body.get("error")
                 if isinstance(body, dict) and isinstance(body.get("error"), dict)
                 else {})
        self.status_code, self.body = 200, body
        self.kind = str(error.get("type") or error.get("code") or "")
        super().__init__(f"{self.kind or 'error'}: {error.get('message', body)}")


USAGE_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
              "output_tokens")


def add_usage(usage: dict, figures) -> None:
    """Fold one event's usage in: a missing or null figure never lowers one already seen,
    and one that cannot be a count of tokens (a string, a float, negative, 401 digits) is
    missing."""
    for key in USAGE_KEYS:
        value = figures.get(key) if isinstance(figures, dict) else None
        if isinstance(value, int) and is_token_count(value) and value > usage.get(key, 0):
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
        field_of = {"text_delta": "text", "input_json_delta": "partial_json",
                    "thinking_delta": "thinking", "signature_delta": "signature"}
        name = field_of.get(delta["type"])
        if name:
            block[name] = (block.get(name) or "") + delta[name]
        if name == "text" and on_text:  # the first half of a split emoji waits for its second
            shown, block["held"] = shown_so_far(block.get("held", "") + delta["text"])
            if shown:
                on_text(shown)
    elif kind == "message_delta":
        add_usage(usage, data.get("usage"))
        return (data.get("delta") or {}).get("stop_reason")
    return None


def tool_input(block: dict):
    """A tool call's input: the streamed JSON if any, else what the block started with.
    Text that is not JSON (or nests too deep to read) comes back as the string it is, never
    completed as the SDK's stream helper completes JSON cut short; make_reply_sendable
    answers it. A lone half of an emoji (a \\udXXX escape alone) becomes U+FFFD."""
    raw = well_formed(block.pop("partial_json", ""))  # halves split across two deltas join here
    if not raw.strip():
        return well_formed_deep(block.get("input", {}))
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    return well_formed_deep(value) if HALF_ESCAPE.search(raw) else value


def piece_of_input(block: dict) -> str:
    """The JSON text one piece of a call carries: what streamed, else its input as text."""
    if block.get("partial_json"):
        return block["partial_json"]
    start = block.get("input")
    return start if isinstance(start, str) else json.dumps(start) if start else ""


def is_complete(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def same_call_runs(blocks: list) -> list:
    """The blocks in runs: a tool_use, then the tool_use blocks that carry its id (or none)
    and its name (or none); empty text blocks between them are left out; any other block
    is a run of its own."""
    runs = []
    for block in blocks:
        last = runs[-1][0] if runs else None
        if block["type"] == "text" and not block.get("text", "").strip():
            continue  # the API refuses an empty text block anyway
        if (block["type"] == "tool_use" and last and last["type"] == "tool_use"
                and block.get("id") in (None, "", last.get("id"))
                and block.get("name") in (None, "", last.get("name"))):
            runs[-1].append(block)
        else:
            runs.append([block])
    return runs


def joined_tool_calls(blocks: list) -> list:
    """One tool call streamed in pieces, each piece its own tool_use block with the call's id
    (LiteLLM relaying llama.cpp repeats the id and name in every chunk, then sends one with
    nothing in it), is one call: the pieces' JSON joined in order. Whole calls that share
    an id stay apart (make_reply_sendable renames the later ones): pieces that are each
    complete JSON, or empty (a call that takes no arguments), and do not join into one."""
    calls = []
    for run in same_call_runs(blocks):
        pieces = [piece_of_input(b) for b in run]
        joined = "".join(pieces)
        if len(run) == 1:
            calls.append(run[0])
        elif joined.strip() and is_complete(joined) or not all(is_complete(p) for p in pieces if p):
            calls.append({**run[0], "partial_json": joined,
                          "name": run[0].get("name") or run[-1].get("name")})
        else:
            calls += run  # whole calls, a call with no arguments among them
    return calls


def finished_blocks(blocks: dict) -> list:
    """The reply's blocks in order, as the wire format's plain dicts ([] when it has none).
    Thinking blocks are kept verbatim, signature included: endpoints want them back exactly
    as sent."""
    content = []
    try:
        pieces = [{key: value for key, value in blocks[index].items() if value is not None}
                  for index in sorted(blocks)]
        for block in joined_tool_calls(pieces):
            if block["type"] == "text":
                if not block.get("text", "").strip():
                    continue  # the API rejects empty text blocks
                block = {"type": "text", "text": well_formed(block["text"])}
            elif block["type"] == "thinking" and isinstance(block.get("thinking"), str):
                # the halves joined: the text that was signed
                block["thinking"] = well_formed(block["thinking"])
            elif block["type"] == "tool_use":
                block = {"type": "tool_use", "id": block["id"], "name": block["name"],
                         "input": tool_input(block)}
            content.append(block)
    except (KeyError, TypeError, AttributeError) as err:
        raise BadReply("the endpoint sent a malformed content block "
                       f"({type(err).__name__}: {err})") from None
    return content


def answered(content: list, stop_reason: str, usage: dict) -> tuple:
    """(content, stop_reason, usage) of a reply that is an answer. No content and no usage
    is a failure, not an answer (EmptyReply); no content but usage (the model said only
    blanks) keeps a placeholder, since the API refuses an empty assistant message."""
    # that one is an overflow: said elsewhere
    if content or stop_reason == "model_context_window_exceeded":
        return content, stop_reason, usage
    if not any(usage.get(key) for key in USAGE_KEYS):
        raise EmptyReply()
    return [own_text("no reply", NO_REPLY)], stop_reason, usage


def reply_from_events(events, on_text) -> tuple:
    """(content, stop_reason, usage) from (kind, data) pairs; raises BadReply or ErrorEvent."""
    blocks, usage, stop_reason, started = {}, {}, None, False
    for kind, data in events:
        if kind == "error":
            raise ErrorEvent(data)
        try:
            stop_reason = apply_event(kind, data, blocks, usage, on_text) or stop_reason
        except (KeyError, TypeError, AttributeError) as err:
            raise BadReply(f"the endpoint sent a malformed {kind} event "
                           f"({type(err).__name__}: {err})") from None
        started = started or kind == "message_start"
    if not started:
        raise BadReply("the endpoint's reply was empty")
    if stop_reason is None:
        raise BadReply("the reply stream ended before the message was complete "
                       "(the connection dropped)")
    return answered(finished_blocks(blocks), stop_reason, usage)


def reply_from_body(raw: bytes, on_text=None) -> tuple:
    """A whole message as JSON where a stream was asked for (some proxies answer so); its
    text goes to on_text at once, as a stream's would have."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadReply("the endpoint's reply was empty" if not raw.strip() else
                       "the endpoint's reply is not JSON: "
                       f"{one_line(raw.decode('utf-8', 'replace'), 60)}") from None
    if isinstance(data, dict) and data.get("error"):
        raise ErrorEvent(data)
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise BadReply(f"the endpoint's reply is not a message: {one_line(json.dumps(data), 60)}")
    usage = {}
    add_usage(usage, data.get("usage"))
    content, stop_reason, usage = answered(finished_blocks(dict(enumerate(data["content"]))),
                                           data.get("stop_reason") or "end_turn", usage)
    for block in content if on_text else []:
        # the placeholder for nothing said is not shown
        if block.get("type") == "text" and OWN not in block:
            on_text(block["text"])
    return content, stop_reason, usage


class SummaryError(Exception):
    """The summary call failed, or returned nothing usable."""


def extract_summary(text: str) -> str:
    """What a summary reply keeps: the text inside <summary>,
    without the <analysis> before it."""
    text = re.sub(r"<analysis>.*?(</analysis>|$)", "", text, flags=re.S)
    match = re.search(r"<summary>(.*?)(</summary>|$)", text, re.S)
    return (match.group(1) if match else text).strip()
