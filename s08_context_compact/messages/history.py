"""The history's wire format, and the two ways it changes.

A history is a list of plain dicts in the Messages API's format. This module reads one
(a message's blocks, a tool result's text, what a run of messages did), marks the blocks
the program wrote itself and takes those marks off before a request, and changes a
history: appending a message and putting a rewritten one in place, each recorded in the
session log the same moment.

Machinery the chapter does not need. It carries a change out and never decides one: which
change to make is a layer's decision. The session log it is handed records each change the
same moment; token_counts.py, beside it, measures the history.
"""

import json
import re

from ..basics import one_line

OWN = "_s08"  # on a block the program wrote: its kind ("snip", "placeholder", ...)
# The fields the program puts on the blocks it wrote, with their types;
# stripped before sending.
PROGRAM_FIELDS = {OWN: str, "snipped": int, "saved_at": str, "summary_by": str, "checks": list,
                  "pending": list, "covers": list, "grouped": str}
# The texts the program's own blocks start with, for the model to read. A user may type any
# of them: the program knows its own blocks by the OWN field, never by their text.
COMPACT_MARKER = "[Compacted"

SNIP_MARKER = "[Snipped"

REACTIVE_MARKER = "[Reactive compact"

RESTORED_MARKER = "[Restored after compaction"

NOTE_MARKER = "[Program note"

PERSISTED_TAG = "<persisted-output"

PLACEHOLDER_PREFIX = "[Earlier tool result"


def blocks_of(message: dict) -> list:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def is_tool_result_message(message: dict) -> bool:
    return message["role"] == "user" and any(b.get("type") == "tool_result"
                                             for b in blocks_of(message))


def result_text(block: dict) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content if part.get("type") == "text")


# stands in for a reply of only blanks: the API refuses an empty assistant message
NO_REPLY = "(no reply)"


def said_text(message: dict) -> str:
    """What the model wrote in a message, without the program's placeholders."""
    return "".join(b["text"] for b in blocks_of(message)
                   if b.get("type") == "text" and OWN not in b)


def own_text(kind: str, text: str, **fields) -> dict:
    """A text block the program wrote (a summary header, a marker, a note)."""
    return {"type": "text", "text": text, OWN: kind, **fields}


def replace_result(block: dict, content: str, kind: str | None = None,
                   saved_at: str | None = None) -> dict:
    """A copy of a tool result with new content;
    kind and saved_at mark a preview or a placeholder."""
    marks = {OWN: kind, **({"saved_at": str(saved_at)} if saved_at else {})} if kind else {}
    return {**block, "content": content, **marks}


def tool_results(messages: list, start: int = 0) -> dict:
    """The tool results of the history from message `start` on, oldest first:
    {(message index, block index): block}."""
    return {(i, k): b for i, m in enumerate(messages[start:], start) if is_tool_result_message(m)
            for k, b in enumerate(blocks_of(m)) if b.get("type") == "tool_result"}


def with_blocks(messages: list, new: dict) -> list:
    """The history with blocks put in place, {(message index, block index): block}: a message
    that changes is copied, once; the very list when no block changed."""
    changed = {}
    for (i, k), block in new.items():
        if block is not blocks_of(messages[i])[k]:
            changed.setdefault(i, list(blocks_of(messages[i])))[k] = block
    if not changed:
        return messages
    return [{**m, "content": changed[i]} if i in changed else m for i, m in enumerate(messages)]


def sendable(message: dict) -> dict:
    """The message as the API takes it: the program's own fields off its blocks."""
    content = blocks_of(message)
    if not any(OWN in block for block in content):
        return message
    return {**message, "content": [{k: v for k, v in b.items() if k not in PROGRAM_FIELDS}
                                   for b in content]}


def is_request_block(block: dict) -> bool:
    """A text block the user typed (the program's own markers are not requests)."""
    return block.get("type") == "text" and OWN not in block


def user_words(messages: list) -> list:
    """Every text block the user typed, oldest first (our own markers left out)."""
    return [b["text"] for m in messages if m["role"] == "user"
            for b in blocks_of(m) if is_request_block(b)]


def with_text(message: dict, *texts) -> dict:
    """A copy of a user message with text blocks (or strings) appended after its tool results."""
    return {**message,
            "content": blocks_of(message) + [t if isinstance(t, dict)
                                             else {"type": "text", "text": t}
                                             for t in texts]}


def last_reply_text(messages: list) -> str:
    """The model's newest text (a text block of the newest assistant message that has one)."""
    return next((b["text"] for m in reversed(messages) if m["role"] == "assistant"
                 for b in reversed(blocks_of(m)) if b.get("type") == "text"), "")


def fresh_id(wanted: str, used: set) -> str:
    """A tool_use id no earlier call has: wanted, else wanted_1, wanted_2, ... (it joins used).
    The API refuses a history in which two calls share an id."""
    unique, n = wanted, 1
    while unique in used:
        unique, n = f"{wanted}_{n}", n + 1
    used.add(unique)
    return unique


def tool_names(messages: list) -> dict:
    """Each tool call's id, and the name of the tool it called."""
    return {b["id"]: b["name"] for m in messages if m["role"] == "assistant"
            for b in blocks_of(m) if b.get("type") == "tool_use"}


CALL_LINES_SHARE = 8  # the calls a cut made, a line each, cost at most 1/8 of what it removed


def what_was_done(removed: list, tools: dict, each: bool = True) -> str:
    """What the snipped messages did, so the model knows what it no longer sees: each call
    as a line (its tool, what it was about, how a command ended, its id), the newest first
    to be kept, as many as cost an eighth of the cut; any older ones (all, unless `each`) as
    the files read and written and the commands run (its declaration in tools says which)."""
    outcome = {b["tool_use_id"]: re.search(r"\[exit code (\d+)\]|\[timed out", result_text(b))
               for m in removed for b in blocks_of(m) if b.get("type") == "tool_result"}
    calls = [b for m in removed for b in blocks_of(m)
             if b.get("type") == "tool_use" and isinstance(b.get("input"), dict)]
    budget = len(json.dumps(removed, ensure_ascii=False)) // CALL_LINES_SHARE if each else 0
    listed = []
    for call in reversed(calls):
        tool = tools.get(call["name"])
        about = call["input"].get(tool.main_argument) if tool and tool.main_argument else None
        about = about if isinstance(about, str) else json.dumps(call["input"], ensure_ascii=False)
        ended = f" ({ending(outcome.get(call['id']))})" if tool and tool.runs else ""
        line = f"\n- {call['name']} {one_line(about, 60)}{ended} (call {call['id']})"
        if len(line) > budget:
            break
        budget -= len(line)
        listed.insert(0, line)
    lines = in_groups(calls[:len(calls) - len(listed)], tools, outcome) + listed
    return " What they did:" + "".join(lines) if lines else ""


def ending(found) -> str:
    """How a command ended, from its result's "[exit code N]" or "[timed out" (found)."""
    return "timed out" if found and not found.group(1) else f"exit {found.group(1) if found else 0}"


def in_groups(calls: list, tools: dict, outcome: dict) -> list:
    """Lines for calls too many to list one by one: the files read and written, the commands
    run and how they ended, the newest 8 of each."""
    done = {"read": [], "wrote": [], "ran": []}
    for call in calls:
        tool = tools.get(call["name"])
        if tool is None:
            continue
        path, command = call["input"].get(tool.path_argument), call["input"].get(tool.runs)
        if tool.reads and isinstance(path, str):
            done["read"].append(path)
        elif tool.writes and isinstance(path, str):
            done["wrote"].append(path)
        elif tool.runs and isinstance(command, str):
            done["ran"].append(f"`{one_line(command, 60)}` ({ending(outcome.get(call['id']))})")
    lines = []
    for kind, items in done.items():
        unique = list(dict.fromkeys(items))
        if unique:
            lines.append(f"\n{kind}: "
                         + (f"{len(unique) - 8} more, then " if len(unique) > 8 else "")
                         + ", ".join(unique[-8:]))
    return lines


def with_snip_note(messages: list, head_end: int, tail_start: int, path, tools: dict) -> list:
    """The history with messages[head_end:tail_start] cut and the one note a snip leaves
    folded into the head's last message; the user's current request, if it went with the
    cut, follows the note verbatim, so it stays in view."""
    removed, tail = messages[head_end:tail_start], messages[tail_start:]
    request = current_request(messages)
    gone = request and current_request(messages[:head_end] + tail) != request
    head_last = head_with_note(messages[head_end - 1], removed, path, tools,
                               request["text"] if gone else None, tail)
    return messages[:head_end - 1] + [head_last] + tail


def head_with_note(head_last: dict, removed: list, path, tools: dict, request: str | None,
                   after: list = ()) -> dict:
    """The head's last message with the one note a snip leaves: how many messages went (the
    counts of earlier snips folded in), where the latest are saved and what they did; then the
    summaries of what earlier snips cut that were among them, so they stay in view (those a
    newer one stands for, here or in `after`, the messages kept after the cut, are left out);
    then `request`, the user's current request if it went with them, so it stays verbatim."""
    notes = [b for b in blocks_of(head_last) if b.get(OWN) == "snip"]
    summaries = still_needed([b for m in [head_last, *removed] for b in blocks_of(m)
                              if b.get(OWN) == "snip_summary"], after)
    kept = [b for b in blocks_of(head_last) if b.get(OWN) not in ("snip", "snip_summary")]
    snipped = sum(b.get("snipped", 0) for b in notes) + len(removed)
    # each cut part, oldest first, for the next summary to read back (snipped_back)
    pending = [p for b in notes for p in b.get("pending", [])] + [str(path)]
    note = (f"{SNIP_MARKER} {snipped} messages from the middle of the conversation; "
            f"the latest ones are saved in {path}.")
    listed, grouped = what_was_done(removed, tools), what_was_done(removed, tools, each=False)
    # the calls one by one until a summary of the part stands for them (with_calls_grouped)
    fields = {"grouped": f"{note}{grouped}]"} if listed != grouped else {}
    texts = [own_text("snip", f"{note}{listed}]", snipped=snipped, pending=pending, **fields),
             *summaries]
    return with_text({**head_last, "content": kept}, *texts, *([request] if request else []))


def with_calls_grouped(messages: list, path: str) -> list:
    """The history with the note of the snip that saved `path` saying what its calls did
    rather than listing each: a summary of that part stands for them now."""
    for i, message in enumerate(messages):
        blocks = blocks_of(message)
        for k, b in enumerate(blocks):
            if b.get(OWN) == "snip" and (b.get("pending") or [None])[-1] == path and "grouped" in b:
                short = {key: value for key, value in b.items() if key != "grouped"}
                short["text"] = b["grouped"]
                changed = {**message, "content": blocks[:k] + [short] + blocks[k + 1:]}
                return messages[:i] + [changed] + messages[i + 1:]
    return messages


def still_needed(summaries: list, after: list) -> list:
    """The summaries of what snip cut that no other stands for: one whose transcripts another
    covers, and more, is left out (that one was written from it)."""
    others = [set(b["covers"]) for b in summaries + [b for m in after for b in blocks_of(m)
              if b.get(OWN) == "snip_summary"] if isinstance(b.get("covers"), list)]
    return [b for b in summaries if not (b.get("covers") and any(
        set(b["covers"]) < cover for cover in others))]


READ_BACK_CHARS = 500   # a tool result or an input's text read back for a summary: its head


def snips_pending(messages: list) -> list:
    """The transcripts of what the snips cut, oldest first, as their notes list them."""
    return list(dict.fromkeys(path for m in messages for b in blocks_of(m)
                              if b.get(OWN) == "snip" and isinstance(b.get("pending"), list)
                              for path in b["pending"] if isinstance(path, str)))


def snips_covered(messages: list) -> set:
    """The transcripts a summary of what snip cut, in these messages, was written from."""
    return covered_by(b for m in messages for b in blocks_of(m))


def covered_by(blocks) -> set:
    """The transcripts the summaries of what snip cut among these blocks stand for."""
    return {path for b in blocks if b.get(OWN) == "snip_summary"
            and isinstance(b.get("covers"), list) for path in b["covers"]}


def waiting_parts(messages: list, read_back, skip=frozenset()) -> list:
    """(transcript, its messages read back by read_back(path), or None) of each part a snip cut
    that no summary in view covers, oldest first. A snip's summary is in view in the history,
    or in a later part read back (a later snip cut the message that held it)."""
    skip = set(skip) | snips_covered(messages)
    parts = [(path, read_back(path)) for path in snips_pending(messages) if path not in skip]
    covered = snips_covered([m for _, part in parts for m in part or []])
    return [(path, part) for path, part in parts if path not in covered and part]


def snipped_back(messages: list, read_back) -> list:
    """The history with what each snip cut, read back from its transcript by read_back(path)
    (the messages, or None), written out after its last message: every call (its id, tool and
    input) and every word, each long text cut to its head (the whole stays on disk). Written
    at the end, as text, a summary request still reads the conversation's cached prefix. What
    a summary in view already covers is not read back; what cannot be read back stays cut (its
    note still says where it went)."""
    parts = [m for _, part in waiting_parts(messages, read_back) for m in part]
    if not parts:
        return messages
    text = ("[What snip cut from the middle of the conversation, read back from its "
            "transcripts; it came before the messages after the snip note:]\n"
            + written_text(parts))
    block = {"type": "text", "text": text, OWN: "read_back"}  # not the user's words
    if messages and messages[-1]["role"] == "user":
        return messages[:-1] + [with_text(messages[-1], block)]
    return messages + [{"role": "user", "content": [block]}]


def written_text(part: list, head_chars: int | None = None) -> str:
    """Messages read back, a line a block (written_out)."""
    return "\n".join(line for m in part for b in blocks_of(m)
                     for line in [written_out(b, head_chars or READ_BACK_CHARS)] if line)


def written_out(block: dict, head_chars: int = READ_BACK_CHARS) -> str:
    """One block of a message, as a line of text: a call with its id, a result (a cleared one
    as where it is saved), words. A summary of what an earlier snip cut is written whole: it
    stands for its part."""
    def head(text) -> str:
        text = str(text)
        return text if len(text) <= head_chars else text[:head_chars] + " [... cut]"
    if block.get(OWN) == "snip_summary" and isinstance(block.get("text"), str):
        return block["text"]
    if block.get("type") == "tool_use":
        return (f"- called {block.get('name')} (call {block.get('id')}): "
                f"{head(json.dumps(block.get('input'), ensure_ascii=False))}")
    if block.get("type") == "tool_result":
        # a cleared result, as where it is saved: its pointer's words say no more
        saved_at = block.get("saved_at")
        if block.get(OWN) == "placeholder" and isinstance(saved_at, str) and saved_at.strip():
            return f"  result of {block.get('tool_use_id')}: cleared, saved in {head(saved_at)}"
        return f"  result of {block.get('tool_use_id')}: {head(result_text(block))}"
    if block.get("type") == "text":
        return f"- said: {head(block.get('text', ''))}"
    return ""


def well_shaped(block) -> bool:
    """A block read back whose fields have the types the API's own have."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        return False
    kind, content = block["type"], block.get("content")
    if kind == "tool_use":
        return isinstance(block.get("id"), str) and isinstance(block.get("input"), dict)
    if kind == "tool_result":
        parts_ok = isinstance(content, list) and all(
            isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content)
        return isinstance(block.get("tool_use_id"), str) and (
            content is None or isinstance(content, str) or parts_ok)
    return kind != "text" or isinstance(block.get("text"), str)


def whole_groups(part: list) -> bool:
    """Whether messages read back are whole groups, as a snip cuts them: an assistant message
    first, each call answered in the message after it, each result answering the one before."""
    if not part or not all(isinstance(m, dict) and isinstance(m.get("content"), list)
                           and all(well_shaped(b) for b in m["content"]) for m in part):
        return False
    if part[0].get("role") != "assistant" or part[-1].get("role") != "user":
        return False
    for before, message in zip([None] + part, part + [None]):
        calls = {b.get("id") for b in (before or {}).get("content", [])
                 if before.get("role") == "assistant" and b.get("type") == "tool_use"}
        results = {b.get("tool_use_id") for b in (message or {}).get("content", [])
                   if b.get("type") == "tool_result"}
        if calls != results or message and message.get("role") not in ("user", "assistant"):
            return False
    return True


def append_message(log, counter, messages: list, message: dict) -> None:
    """Append a message to the history, and to the session log (if any) the same moment; the
    loop's token counter says whether the message is the one the last usage measured."""
    messages.append(message)
    if log:  # a reply's usage measures the history up to it: --resume starts exact
        log.message(message,
                    counter.anchor_tokens if message is counter.last_anchored() else None)


def replace_history(log, messages: list, new: list, reason: str) -> None:
    """Put a rewritten history in place (same list object),
    and record what changed in the log, if any."""
    if new is messages:
        return
    if log:
        log.rewrite(messages, new, reason)
    messages[:] = new


def cut_long_texts(message: dict, max_chars: int) -> dict:
    """A copy with every long text and tool result cut to max_chars
    (for a summary request only)."""
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


def paths_read(messages: list, tools: dict) -> set:
    """The paths a tool that reads a file read in these messages whose results are still there
    whole (not cleared to a pointer, not a stub pointing elsewhere)."""
    whole = {b.get("tool_use_id") for m in messages for b in blocks_of(m)
             if b.get("type") == "tool_result"
             and OWN not in b
             and not result_text(b).startswith("(unchanged: ")}  # repeat_reads' stub
    readers = {name: tool.reads for name, tool in tools.items() if tool.reads}
    return {b["input"].get(readers[b.get("name")]) for m in messages for b in blocks_of(m)
            if b.get("name") in readers
            and b.get("id") in whole
            and isinstance(b.get("input"), dict)}


def current_request(messages: list) -> dict | None:
    """The newest text block the user typed (our own markers are not requests)."""
    for message in reversed(messages):
        if message["role"] == "user":
            for block in reversed(blocks_of(message)):
                if is_request_block(block):
                    return {"type": "text", "text": block["text"]}
    return None



def group_starts(messages: list) -> list:
    """Indexes where the history may be cut:
    each assistant message starts a group with its results."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def snip_bounds(messages: list, keep_head: int, keep_tail: int, at_least: int) -> tuple | None:
    """(where the head ends, where the tail starts): what snip cuts lies between, at least
    `at_least` messages when the history is long enough, or None. The head ends just before
    an assistant message and the tail begins with one, so both cut points fall between a
    tool_result message and the next call, never inside a pair."""
    if len(messages) <= keep_head + keep_tail:
        return None
    keep_tail = max(1, min(keep_tail, len(messages) - keep_head - at_least))
    starts = group_starts(messages)
    head_end = next((i for i in starts if i >= keep_head), None)
    tail_start = next((i for i in reversed(starts) if i <= len(messages) - keep_tail), None)
    if head_end is None or tail_start is None or tail_start <= head_end:
        return None
    return head_end, tail_start



def message_groups(messages: list) -> list:
    """The history from its first assistant message on, as groups: a call and its results
    (and any user words after them) travel together."""
    starts = group_starts(messages)
    return [messages[start:end] for start, end in zip(starts, starts[1:] + [len(messages)])]
