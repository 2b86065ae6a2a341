"""Reply builders of the fake Messages API: the dicts a test scripts into `FakeAnthropic.replies`
and `summaries` (`text`, `tool_use`, `tool_uses`, `error`, ...) and the scripted misbehaviours
(`malformed`, `error_event`, `silent_failure`, `hang`, `held`, `drip`, `pings_only`,
`broken_tool_json`, `split_surrogates`), with `utf16_pieces` and `RawJSON`, which the handler
uses to stream them."""

from __future__ import annotations

import threading
from typing import Any


# ---------------------------------------------------------------- reply builders

def text(body: str, **extra) -> dict:
    """A reply whose content is one text block."""
    return {"content": [{"type": "text", "text": body}], **extra}


def tool_use(name: str, input: Any, id: str | None = None, preface: str | None = None) -> dict:
    """A reply that calls one tool (optionally after a sentence of text).

    `input` is normally a dict; a string or a list is sent as it is, since models
    behind some endpoints produce such inputs and the client must cope."""
    return tool_uses([(name, input, id)], preface=preface)


def tool_uses(calls, preface: str | None = None) -> dict:
    """A reply with several tool calls in one assistant message (parallel tool use)."""
    content = [{"type": "text", "text": preface}] if preface else []
    for call in calls:
        name, args = call[0], call[1]
        call_id = call[2] if len(call) > 2 else None
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
    return {"content": content}


def error(status: int, kind: str, message: str, **extra) -> dict:
    """A reply that is an HTTP error with the API's error envelope."""
    return {"error": {"status": status, "type": kind, "message": message}, **extra}


def split_surrogates(reply: dict) -> dict:
    """The same reply, streamed with each emoji (any character beyond the BMP) cut into its
    two UTF-16 halves across two deltas: JSON `\\ud83d` ends one text_delta, thinking_delta or
    input_json_delta and `\\ude00` starts the next, as endpoints that cut a stream by UTF-16
    units send it. The client must join them; each half alone cannot be encoded."""
    return dict(reply, split_surrogates=True)


def utf16_pieces(text: str) -> list:
    """text as UTF-16 halves, cut after every first half (the pieces rejoined are the text)."""
    pieces, piece = [], ""
    for char in text:
        if ord(char) <= 0xFFFF:
            piece += char
            continue
        high, low = divmod(ord(char) - 0x10000, 0x400)
        pieces.append(piece + chr(0xD800 + high))
        piece = chr(0xDC00 + low)
    return pieces + [piece] if piece or not pieces else pieces


def overloaded() -> dict:
    return error(529, "overloaded_error", "Overloaded")


def server_error() -> dict:
    return error(500, "api_error", "Internal server error")


class RawJSON(str):
    """Tool input text streamed verbatim as partial_json, even when it is not valid JSON."""


def broken_tool_json(name: str, partial: str = '{"path": "a.py", ', id: str | None = None) -> dict:
    """A tool call whose streamed input_json_delta pieces add up to invalid JSON.

    A JSON (non-streamed) reply carries the broken text as a string `input`."""
    return {"content": [{"type": "tool_use", "id": id, "name": name, "input": RawJSON(partial)}],
            "stop_reason": "tool_use"}


MALFORMED = ("sse_not_json", "json_body", "empty_body", "bad_utf8")


def malformed(kind: str, reply: dict | None = None) -> dict:
    """A reply broken on the wire. These are sent as they are, streamed request or not:

    - "sse_not_json": 200 SSE whose second event's data line is not JSON, then close;
    - "json_body": the whole message as a JSON body although the request asked to
      stream (`reply` is its content; the default reply when None);
    - "empty_body": 200 text/event-stream with content-length 0;
    - "bad_utf8": a text reply whose delta holds a byte that is not UTF-8.
    """
    if kind not in MALFORMED:
        raise ValueError(f"malformed kind must be one of {MALFORMED}, not {kind!r}")
    return {"malformed": kind, "reply": reply}


def error_event(kind: str = "overloaded_error", message: str = "Overloaded") -> dict:
    """A 200 stream that sends message_start, then an `error` event, then closes.

    Overflow texts can arrive this way too, e.g.
    error_event("invalid_request_error", "prompt is too long: 300 tokens > 200 maximum")."""
    return {"error_event": {"type": kind, "message": message}}


def silent_failure() -> dict:
    """What LiteLLM streams when the server behind it failed: a 200 with no content and no
    usage, ending in end_turn (see `_send_silent_failure`)."""
    return {"silent_failure": True}


def hang(seconds: float | None = None) -> dict:
    """Read the request and send nothing at all, not even a status line, until the
    client hangs up or `seconds` pass (None: until the server shuts down)."""
    return {"hang": seconds}


def held(reply: dict, gate: threading.Event | None = None, seconds: float | None = None) -> dict:
    """`reply`, sent only once `gate` is set or `seconds` have passed: a slow model, or one a
    test releases when it chooses. A client that hangs up first is recorded in `stalls`
    ("client closed"), and gets nothing."""
    return {"held": reply, "gate": gate, "seconds": seconds}


def drip(seconds_per_byte: float) -> dict:
    """A 200 stream of message_start, then a text block's start sent one byte at a time,
    `seconds_per_byte` apart, until the client hangs up (or the event is whole): a reply
    that never stops but never gets anywhere."""
    return {"drip": seconds_per_byte}


def pings_only(seconds: float, style: str = "event") -> dict:
    """A 200 stream of message_start followed only by keep-alives, every PING_INTERVAL
    seconds for `seconds`, then the connection closes. They defeat a read timeout.
    style: "event" (`event: ping`), "data" (a ping with no event line), or "comment"
    (an SSE comment line, as OpenRouter sends while a model is thinking)."""
    return {"pings_only": seconds, "ping_style": style}
