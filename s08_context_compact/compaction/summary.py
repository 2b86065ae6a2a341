"""The pieces of a summary: the instruction that asks for one, the history cut to fit the
window for it, a summary built without the model when the model cannot write one, the pieces
that come back after a summary (the user's recent words, the files read most recently, a
hook's lines, the todo list), and the new history made of them (replace_with_summary).

Machinery the chapter does not need. It decides neither when a summary is made nor with
what: the layer that asks for the summary decides, and the endpoint asks the model.
Everything here takes values (the settings it reads, the files read, the hooks' answers),
never the agent; the store it is handed saves the whole history before it is replaced.
"""

from dataclasses import dataclass
from pathlib import Path

from ..basics import inside_workspace, redact, Redactor
from .previews import preview_results
from ..endpoint import SummaryError
from ..messages import (CHARS_PER_TOKEN, COMPACT_MARKER, OWN, REACTIVE_MARKER, RESTORED_MARKER,
                        SNIP_MARKER, blocks_of, current_request, cut_long_texts,
                        estimate_text_tokens, estimate_tokens, head_within, last_reply_text,
                        message_groups, newest_within, own_text, replace_result, result_text,
                        snips_covered, snips_pending, user_words)
from .ledger import short_hash

# after compaction, re-read at most this many of the files read most recently
POST_COMPACT_MAX_FILES = 5
SUMMARY_INSTRUCTIONS = """\
TEXT ONLY, NO TOOLS. Do not call any tool in this answer: this turn only writes a
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


def summary_instructions(focus: str, limit_tokens: int) -> str:
    extra = f"Focus especially on: {focus}\n" if focus else ""
    extra += (f"Keep the <summary> under {limit_tokens:,} tokens "
              f"(about {limit_tokens * 3 // 4:,} words).\n")
    return SUMMARY_INSTRUCTIONS.replace("{extra}", extra)


def cleared_to_fit(messages: list, budget: int) -> list | None:
    """The messages with their oldest tool results cleared so that they fit in budget tokens
    (every call stays), or None when that is not enough."""
    cleared = results_cleared(messages, budget)
    return cleared if estimate_tokens(cleared) <= budget else None


def results_cleared(messages: list, max_tokens: int) -> list:
    """The messages with their oldest tool results cleared, oldest first, until they fit in
    max_tokens (or nothing is left to clear): every call stays in a summary request."""
    over = estimate_tokens(messages) - max_tokens
    cleared = list(messages)
    for i, message in enumerate(messages):
        if over <= 0:
            break
        blocks = list(blocks_of(message))
        for k, block in enumerate(blocks):
            size = estimate_text_tokens(result_text(block))
            if block.get("type") == "tool_result" and over > 0 and size > CLEARED_TOKENS:
                blocks[k] = replace_result(block, CLEARED_FOR_SUMMARY)
                over -= size - CLEARED_TOKENS
        cleared[i] = {**message, "content": blocks} if blocks != blocks_of(message) else message
    return cleared


def fit_in_pieces(messages: list, budget: int, room: int = 0):
    """What a summary request carries when the messages do not fit one (budget tokens): first
    the oldest tool results cleared (every call stays in it); if that is not enough, the
    newest messages that fit in room, after a summary of the older ones written a piece at a
    time. A generator: it yields each piece's request messages (the summary so far, then the
    piece), is sent that piece's summary, and returns what the last request carries."""
    cleared = cleared_to_fit(messages, budget)
    if cleared is not None:
        return cleared
    messages = results_cleared(messages, budget)
    if room < MIN_PIECE_TOKENS:
        raise SummaryError("too little of the window is left for a summary request beside its "
                           "reply (/context shows the window, and how the endpoint counts)")
    messages = yield from read_back_in_pieces(messages, room)
    older, newest = split_for_summary(messages, room)
    earlier = ""
    for piece in summary_pieces(older, room):
        earlier = yield after_summary(earlier, piece)
    return after_summary(earlier, newest)


MIN_PIECE_TOKENS = 500   # below this a piece holds too little to be worth a call


def read_back_in_pieces(messages: list, room: int):
    """The messages with what snip cut, read back at their end (messages/history.py's
    snipped_back), summarized a part at a time when it is bigger than room: it is one block,
    which no split between messages could cut."""
    last = messages[-1] if messages else {}
    blocks = blocks_of(last) if last.get("role") == "user" else []
    found = [k for k, b in enumerate(blocks) if b.get(OWN) == "read_back"]
    if not found or estimate_text_tokens(blocks[found[0]]["text"]) <= room // 2:
        return messages
        yield  # a generator, as fit_in_pieces is
    text, earlier = blocks[found[0]]["text"], ""
    step = max(room // 2 * CHARS_PER_TOKEN, 1)
    for start in range(0, len(text), step):
        chunk = {"role": "user", "content": [{"type": "text", "text": text[start:start + step]}]}
        earlier = yield after_summary(earlier, [chunk])
    summarized = {**blocks[found[0]], "text": "[What snip cut from the middle of the "
                  f"conversation, read back and summarized a part at a time:]\n{earlier}"}
    return messages[:-1] + [{**last, "content": blocks[:found[0]] + [summarized]
                             + blocks[found[0] + 1:]}]


def split_for_summary(messages: list, max_tokens: int) -> tuple:
    """(the oldest messages, which do not fit one summary request; the newest whole groups,
    which fit in max_tokens). Tool pairs are never split; when not even the newest group
    fits, it is kept cut short."""
    if estimate_tokens(messages) <= max_tokens:
        return [], messages
    groups = message_groups(messages)
    kept = [m for group in newest_within(groups, max_tokens, estimate_tokens) for m in group]
    if not kept:
        newest = groups[-1] if groups else messages[-1:]
        kept = [cut_long_texts(m, max_tokens // len(newest)) for m in newest]
    return messages[:len(messages) - len(kept)], kept


CLEARED_FOR_SUMMARY = "[cleared from this summary request to fit the window; the transcript has it]"
CLEARED_TOKENS = 30


def summary_pieces(messages: list, max_tokens: int) -> list:
    """The messages in consecutive pieces of whole groups, each within max_tokens (a group
    bigger than that cut short); what comes before the first group starts the first."""
    groups = message_groups(messages)
    start = len(messages) - sum(map(len, groups))
    pieces, piece = [], []
    for unit in ([messages[:start]] if start else []) + groups:
        if estimate_tokens(unit) > max_tokens:
            unit = [cut_long_texts(m, max_tokens // len(unit)) for m in unit]
        if piece and estimate_tokens(piece + unit) > max_tokens:
            pieces.append(piece)
            piece = []
        piece = piece + unit
    return pieces + ([piece] if piece else [])


def after_summary(earlier: str, messages: list) -> list:
    """A summary request's messages: what came before them, summarized (when anything did),
    then the messages."""
    text = ("[The conversation before this point did not fit one request. Summarized a part "
            f"at a time, it says:\n{earlier}\n(end of that summary)]" if earlier else
            "[This is where the conversation starts.]")
    note = {"type": "text", "text": text}
    if messages and messages[0]["role"] == "user":  # one turn: the roles still alternate
        return [{**messages[0], "content": [note] + blocks_of(messages[0])}] + messages[1:]
    return [{"role": "user", "content": [note]}] + messages


def fallback_summary(messages: list, todos: list, limit_tokens: int, why: str) -> str:
    """A summary assembled without the model, so compaction succeeds in every case."""
    said = user_words(messages)
    paths = [b["input"]["path"] for m in messages if m["role"] == "assistant"
             for b in blocks_of(m)
             if b.get("type") == "tool_use" and isinstance(b["input"].get("path"), str)]
    last = last_reply_text(messages)
    # the summary already in the history stands for all before it: dropped, it would be lost
    earlier = [b["text"].split("]\n\n", 1)[-1] for m in messages for b in blocks_of(m)
               if b.get(OWN) in ("compact", "reactive") and isinstance(b.get("text"), str)]
    parts = [f"(Assembled without the model, because {why}: "
             "the summary before it, the user's messages, the files touched, "
             "the todo list and the last reply. The transcript has the rest.)"]
    if earlier:
        parts.append("The summary before this one:\n" + head_within(earlier[-1], limit_tokens // 3))
    # what snip cut that no summary stands for: not summarized here either, so say where it is
    covered = snips_covered(messages)
    waiting = [path for path in snips_pending(messages) if path not in covered]
    if waiting:
        parts.append("What snip cut and this summary could not summarize is saved in: "
                     + ", ".join(waiting))
    parts += ["User messages, oldest first:\n" + "\n".join(f"- {t[:500]}" for t in said[-20:]),
              "Files touched: " + (", ".join(dict.fromkeys(paths)) or "none")]
    if todos:
        parts.append("Todo list:\n" + render_todos(todos))
    if last:
        parts.append(f"The assistant's last reply:\n{last[:1500]}")
    return head_within("\n\n".join(parts), limit_tokens - 1)


def render_todos(todos: list) -> str:
    marks = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]"}
    return ("\n".join(f"{marks[t['status']]} {t['content']}" for t in todos)
            or "(todo list is empty)")


def recent_user_messages(messages: list, max_tokens: int) -> str:
    """The user's own words, newest first and verbatim, up to max_tokens. A request still
    being worked on is left out: it comes last anyway (replace_with_summary)."""
    said = user_words(messages)
    in_flight = bool(messages) and messages[-1]["role"] == "user"
    kept = newest_within(said[:-1] if in_flight else said, max_tokens, estimate_text_tokens)[::-1]
    if not kept:
        return ""
    return (f"{RESTORED_MARKER}: recent user messages, newest first]\n"
            + "\n".join(f"- {t}" for t in kept))


def restored_files(reads: dict, workdir: Path, secrets, max_tokens: int, per_file: int,
                   shown: set = frozenset()) -> list:
    """The most recently read files not still shown, re-read from disk now;
    a changed or vanished file says so."""
    blocks, used = [], 0
    reads = [(path, read) for path, read in reversed(reads.items()) if path not in shown]
    for path, (_, _, digest) in reads[:POST_COMPACT_MAX_FILES]:
        target = inside_workspace(workdir, path)
        if target is None or not target.is_file():
            blocks.append(f"{RESTORED_MARKER}: {path}] "
                          "This file was read earlier and has since vanished.")
            continue
        room = min(per_file, max_tokens - used)
        if room <= 50:
            continue
        with open(target, "rb") as f:
            # a key across the cut is read whole
            raw = f.read(room * CHARS_PER_TOKEN + secrets.reach)
        if b"\0" in raw[:8192]:
            continue
        # a file may hold a key
        text = head_within(redact(raw.decode("utf-8", "replace"), secrets), room)
        state = "unchanged since it was read" if short_hash(target) == digest else \
            "it CHANGED since it was last read; this is its content now"
        cut = ("" if len(text.encode()) >= target.stat().st_size
               else "\n[... cut here; read_file shows the rest]")
        blocks.append(f"{RESTORED_MARKER}: {path}, re-read from disk, {state}]\n{text}{cut}")
        used += estimate_text_tokens(blocks[-1])
    return blocks


def hook_restores(answer: dict, max_tokens: int) -> str:
    """What a RestoreContext hook keeps: its newest lines that fit, under its heading."""
    lines = newest_within(answer["lines"], max_tokens, estimate_text_tokens)
    if not lines:
        return ""
    return f"{RESTORED_MARKER}: {answer['what']}]\n" + "\n".join([answer["heading"]] + lines)


def nothing_to_summarize(messages: list, restored: list, tail_tokens: int, slack: int) -> bool:
    """Whether the history holds little more than a summary cannot remove: what comes back
    after it, and (about) the summary already there, give or take slack tokens. Then a model
    call would be wasted."""
    request = current_request(messages)
    # an earlier summary, and what came back after it, would only be said again
    summaries = [b["text"] for m in messages for b in blocks_of(m)
                 if b.get(OWN) in ("compact", "reactive", "restored")]
    kept = tail_tokens + sum(map(estimate_text_tokens, restored + summaries)) + slack
    request_tokens = estimate_text_tokens(request["text"]) if request else 0
    return estimate_tokens(messages) <= kept + request_tokens


def smaller_budget(budget: int, sent: list, overflow) -> int:
    """The budget for the next try after a summary request did not fit: the endpoint may say
    by how much it was over (overflow.prompt_tokens of overflow.window), and that much more
    is left out; when it does not say, half."""
    over = 2.0
    if overflow.window and overflow.prompt_tokens:
        over = overflow.prompt_tokens / overflow.window
    return int(min(budget, estimate_tokens(sent)) / max(over, 1.1) * 0.9)


def reply_problem(answer, limit: int) -> str:
    """Why a summary's reply (an endpoint Answer) cannot be used ("" when it can): a tool
    call in place of the text, or summary_problem's."""
    called = any(block.get("type") == "tool_use" for block in answer.message["content"])
    if called and not answer.summary:
        return "the reply called a tool instead of writing the summary"
    return summary_problem(answer.summary, limit)


def summary_problem(summary: str, limit: int) -> str:
    """Why a summary cannot be used ("" when it can): empty, or too long."""
    if not summary:
        return "empty"
    if estimate_text_tokens(summary) > limit:
        return f"{estimate_text_tokens(summary):,} tokens, over the {limit:,} it must fit in"
    return ""


@dataclass(frozen=True)
class Restorable:
    """What can come back after a summary, as the loop has it now."""
    hooks: list                 # what RestoreContext hooks answered: {what, heading, lines}
    reads: dict                 # the files read (path -> (size, mtime, digest)), oldest first
    workdir: Path
    secrets: Redactor           # a read file may hold a key
    todos: list
    skills: list                # the skills loaded


def what_comes_back(messages: list, restorable: Restorable, s, fixed: int, shown: set) -> tuple:
    """(the blocks that come back after a summary, the tokens left for the summary).

    fixed tokens (the system prompt, tools and the tail) and the request come with the
    summary whatever it says. Everything together stays under s.compacted_max (a quarter of
    the window); at least a third of that is kept for the summary itself, and a long tail
    still lets the pieces back (a fortieth of the window at least)."""
    request = current_request(messages)
    fixed += (estimate_text_tokens(request["text"]) if request else 0) + 100
    room = max(s.compacted_max - fixed - s.compacted_max // 3, s.window // 40)
    parts = [hook_restores(answer, min(s.ledger_tokens, max(room, 0)))
             for answer in restorable.hooks]
    user_room = min(s.restore_user_tokens, room - sum(map(estimate_text_tokens, parts)))
    parts.append(recent_user_messages(messages, user_room))
    files_room = min(s.restore_files_tokens, room - sum(map(estimate_text_tokens, parts)))
    parts += restored_files(restorable.reads, restorable.workdir, restorable.secrets, files_room,
                            s.restore_file_tokens, shown)
    if restorable.todos:
        parts.append(f"{RESTORED_MARKER}: todo list]\n{render_todos(restorable.todos)}")
    if restorable.skills:
        parts.append(f"{RESTORED_MARKER}: skills loaded earlier] {', '.join(restorable.skills)} "
                     "(call load_skill again to see their instructions)")
    restored = [p for p in parts if p]
    limit = s.compacted_max - fixed - sum(estimate_text_tokens(p) for p in restored)
    return restored, max(limit, s.window // 40)


def summary_marks(summary: str, source: str, checks: list) -> tuple:
    """(the transcript's footer, the summary block's marks): who wrote the summary, and what
    the PostCompact hooks' checks found (each answer's fields; its "note", said)."""
    found = {key: value for answer in checks for key, value in answer.items() if key != "note"}
    footer = {"type": "compaction", "summary_by": source, "summary": summary, **found}
    marks = {"summary_by": source, "checks": [a["note"] for a in checks if a.get("note")]}
    return footer, marks


def replace_with_summary(messages: list, kind: str, summary: str, tail: list, restored: list, *,
                         store, preview_chars: int, footer: dict | None = None,
                         pending: tuple = (), marks: dict | None = None) -> list:
    """Save the whole history (the footer last), then one user message with the summary
    (its header block carrying `marks`: who wrote it, what the checks found), the restored
    context and, last, the request being worked on; then the tail, its big results saved
    and previewed (previews.py)."""
    path = store.save_messages(messages, kind, footer)
    marker = REACTIVE_MARKER if kind == "reactive" else COMPACT_MARKER
    header = (f"{marker}: the earlier conversation was summarized to free context. "
              f"The full transcript is saved at {path}.]\n\n{summary}")
    content = [own_text(kind, header, **(marks or {}))] + [own_text("restored", t)
                                                           for t in restored]
    if pending:  # cut after what this summary was written from: the next one reads it back
        content.insert(1, own_text("snip", f"{SNIP_MARKER} after this summary's snapshot: "
                                   f"saved in {', '.join(pending)}.]", snipped=0,
                                   pending=list(pending)))
    first = {"role": "user", "content": content}
    tail = [preview_results(m, preview_chars, store) if m["role"] == "user" else m for m in tail]
    request = current_request(messages)
    in_flight = messages and messages[-1]["role"] == "user"  # a finished turn has no request
    if request and in_flight and current_request(tail) != request:
        first["content"].append(request)
    result = [first] + tail
    # Every layer hands back a history no larger than it got
    # (a short one would only gain a header)
    return result if estimate_tokens(result) < estimate_tokens(messages) else messages
