"""A history replayed from a session log, made valid for the API whatever the log lost or
holds: a call the program was killed in the middle of is answered as interrupted, a
result without its call is dropped, and a log edited by hand or written by an older
version is cleaned block by block (empty text, unknown blocks, fields the API does not
take, a reused tool_use id, a result that is not text).

Machinery the chapter does not need: session_log.py repairs what --resume reads back.
"""

import json
from collections import Counter

from ..messages import OWN, PROGRAM_FIELDS, blocks_of, fresh_id, input_problem
from ..basics import counted

def unanswered(calls: list) -> list:
    return [{"type": "tool_result", "tool_use_id": c["id"], "is_error": True,
             "content": "Interrupted: the program stopped before this call finished."}
            for c in calls]


# What the Messages API takes in a block of each type (cache marks aside: the program adds
# its own to each request, and the history never holds one), and who may send it.
BLOCK_KEYS = {"text": {"type", "text", "citations"}, "tool_use": {"type", "id", "name", "input"},
              "tool_result": {"type", "tool_use_id", "content", "is_error"},
              "thinking": {"type", "thinking", "signature"}, "redacted_thinking": {"type", "data"},
              "image": {"type", "source"},
              "document": {"type", "source", "title", "context", "citations"}}
# What a block of each kind must hold (of text, tool_use and tool_result: is_message checks)
REQUIRED = {"thinking": {"thinking": str, "signature": str}, "redacted_thinking": {"data": str},
            "image": {"source": dict}, "document": {"source": dict}}
SENT_BY = {"tool_use": "assistant", "thinking": "assistant", "redacted_thinking": "assistant",
           "tool_result": "user"}
REPAIRS = {"dropped": "dropped {}", "renamed": "renamed {}", "text": "turned {} into text",
           "emptied": "replaced {} by {{}}", "answered": "answered {} as interrupted"}


def right_type(value, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) and (kind is not list
                                        or all(isinstance(item, str) for item in value))


def clean_block(block: dict, role: str, found: Counter) -> dict | None:
    """A block as the API takes it, or None when it cannot be sent at all. What was dropped
    or changed is counted in found."""
    kind = block.get("type")
    if kind not in BLOCK_KEYS or SENT_BY.get(kind, role) != role:
        found["dropped", "unknown or misplaced block"] += 1
        return None
    # the program's fields, on its own blocks
    program = PROGRAM_FIELDS if isinstance(block.get(OWN), str) else {}
    for key in [k for k in block if k not in BLOCK_KEYS[kind]]:
        if key in program and right_type(block[key], program[key]):
            continue
        if key == "cache_control":
            what = "cache mark"
        elif key in PROGRAM_FIELDS:
            what = "bad program marker"
        else:
            what = "unknown field"
        found["dropped", what] += 1
        block = {k: v for k, v in block.items() if k != key}
    if kind == "text" and not block["text"].strip():
        found["dropped", "empty text block"] += 1
        return None
    if kind == "tool_use" and input_problem(block.get("input")):
        found["emptied", "bad tool input"] += 1
        return {**block, "input": {}}
    if kind == "tool_result":
        return clean_result(block, found)
    required = REQUIRED.get(kind, {})
    if not all(isinstance(block.get(key), kind_of) for key, kind_of in required.items()):
        found["dropped", "unknown or misplaced block"] += 1
        return None
    return block


def clean_result(block: dict, found: Counter) -> dict:
    """A tool result whose content is text, or a list of text and image parts."""
    content = block.get("content", "")
    if "is_error" in block and not isinstance(block["is_error"], bool):
        found["dropped", "unknown field"] += 1
        block = {k: v for k, v in block.items() if k != "is_error"}
    parts_ok = isinstance(content, list) and content and all(
        isinstance(p, dict) and set(p) <= {"type", "text", "source"} and (
            p.get("type") == "text" and isinstance(p.get("text"), str) and p["text"].strip()
            or p.get("type") == "image" and isinstance(p.get("source"), dict)) for p in content)
    if isinstance(content, str) or parts_ok:
        return block
    found["text", "tool result"] += 1
    texts = []
    if isinstance(content, list):
        texts = [p["text"] for p in content
                 if isinstance(p, dict) and isinstance(p.get("text"), str)]
    text = "\n".join(texts) if texts else "(no output)" if content is None else json.dumps(content)
    return {**block, "content": text.strip() or "(no output)"}


def clean_message(message: dict, found: Counter) -> dict | None:
    """A message with only what the API takes; None when nothing is left of it (the API
    refuses an empty message, the last assistant one aside, and a new prompt follows that)."""
    if set(message) - {"role", "content"}:
        found["dropped", "unknown field"] += len(set(message) - {"role", "content"})
    blank = isinstance(message["content"], str) and not message["content"].strip()
    cleaned = (clean_block(block, message["role"], found) for block in blocks_of(message))
    content = [] if blank else [b for b in cleaned if b]
    if not content:
        found["dropped", "empty message"] += 1
        return None
    if content == blocks_of(message) and set(message) == {"role", "content"}:
        return message
    return {"role": message["role"], "content": content}


def unique_ids(message: dict, used: set, found: Counter) -> tuple:
    """(the reply with every tool_use id not used before, [(the id its results use, the call)])."""
    content, calls = [], []
    for block in blocks_of(message):
        if block.get("type") == "tool_use":
            unique = fresh_id(block["id"], used)
            if unique != block["id"]:
                found["renamed", "reused tool_use id"] += 1
            calls.append((block["id"], {**block, "id": unique}))
            block = calls[-1][1]
        content.append(block)
    return (message if all(new is old for new, old in zip(content, blocks_of(message))) else
            {**message, "content": content}), calls


def answer_calls(message: dict, calls: list, found: Counter) -> list:
    """A user message's content: a result for each call of the reply before it first (one the
    log has, or one saying the call was interrupted), then its other blocks."""
    waiting, results = list(calls), []
    for block in [b for b in blocks_of(message) if b.get("type") == "tool_result"]:
        match = next((pair for pair in waiting if pair[0] == block["tool_use_id"]), None)
        if match is None:
            found["dropped", "orphaned tool result"] += 1
            continue
        waiting.remove(match)
        renamed = match[1]["id"]
        results.append(block if renamed == block["tool_use_id"]
                       else {**block, "tool_use_id": renamed})
    if waiting:
        found["answered", "unanswered call"] += len(waiting)
    return results + unanswered([call for _, call in waiting]) + \
        [b for b in blocks_of(message) if b.get("type") != "tool_result"]


def repair_history(messages: list, found: Counter | None = None) -> list:
    """Make a history from a log valid for the API again, whatever the log lost or an edit
    (or an older version, or a second writer) put in: every block is one the API takes
    (clean_block); it starts with the user and the roles alternate; every call has an id of
    its own and is answered right after it (a call the program stopped in gets a result
    saying so); a result with no call is dropped. What was changed is counted in found."""
    found = Counter() if found is None else found
    repaired, used, calls = [], set(), []  # calls: those of the last reply, still to be answered
    for message in messages:
        message = clean_message(message, found)
        if message is None:
            continue
        if message["role"] == "assistant":
            if not repaired:
                found["dropped", "leading assistant message"] += 1
                continue
            if calls:
                answers = answer_calls({"content": []}, calls, found)
                repaired.append({"role": "user", "content": answers})
            message, calls = unique_ids(message, used, found)
            # two replies in a row: the API takes them as one
            if repaired[-1]["role"] == "assistant":
                message = {**message, "content": blocks_of(repaired.pop()) + blocks_of(message)}
            repaired.append(message)
            continue
        content = answer_calls(message, calls, found)
        calls = []
        if repaired and repaired[-1]["role"] == "user":
            # keep the roles alternating
            repaired[-1] = {**repaired[-1], "content": blocks_of(repaired[-1]) + content}
        elif content:
            repaired.append(message if content == blocks_of(message)
                            else {**message, "content": content})
    if calls:
        repaired.append({"role": "user", "content": answer_calls({"content": []}, calls, found)})
    return repaired


def what_was_repaired(found: Counter) -> str:
    """One line: what repair_history changed, by kind."""
    said = []
    for verb, template in REPAIRS.items():
        things = [counted(n, noun) for (kind, noun), n in found.items() if kind == verb]
        if things:
            said.append(template.format(", ".join(things)))
    return "; ".join(said)
