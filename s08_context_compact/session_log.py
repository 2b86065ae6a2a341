"""The session log: every message and every rewrite of the history, appended to a
JSON-lines file the moment it happens, so a crash loses at most the line being written;
and reading it back for --resume and --list, repairing what a crash, an edit or an older
version broke so the API takes it again. A session is open in one program at a time:
the program that writes a log holds a lock on it.

Machinery the chapter does not need: the history's changes reach it through history.py
(append_message, replace_history) and turns.py (the user's prompt); code.py never sees a
record's layout.
"""

import json
import os
import shlex
import shutil
import stat
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from history import OWN, PROGRAM_FIELDS, blocks_of, fresh_id, last_reply_text
from redaction import Redactor
from surrogates import HALF_ESCAPE, well_formed, well_formed_deep
from terminal import counted, cut_to_width, display_width, one_line, printable
from tool_input import input_problem
from workspace_io import file_kind, open_log, open_regular

try:
    import fcntl  # a lock on the log, so two programs never append to one session
except ImportError:  # Windows: no lock
    fcntl = None

TRANSCRIPT_DIR = ".transcripts"


class SessionInUse(Exception):
    """Another program has this session open: two writers would interleave their records."""


def interpreter() -> str:
    """How to name the Python that runs this program in a command to type: "python" when
    that is the one the shell finds, else its full path (a virtual environment not activated)."""
    found = shutil.which("python")  # links are not followed: a venv's python links to the one it came from
    same = found and os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(sys.executable))
    return "python" if same else shlex.quote(sys.executable)


class SessionLog:
    """An append-only JSON-lines file, flushed to disk after every record. It watches the
    endpoint the session shares with its subagents: what is learned about it (its window,
    say) is recorded before the next record, so --resume starts from it. It also keeps
    the history the log holds so far: if the file is deleted while the program runs, the
    log is written again from it, and --resume still finds the session."""

    def __init__(self, path: Path, secrets=(), warn=print, header: dict | None = None, endpoint=None):
        self.path, self.secrets, self.warn = path, Redactor.of(secrets), warn
        self.header = header or {"type": "session", "id": path.stem.removeprefix("session-")}
        self.file = None  # opened with the first record: a session with no messages leaves no file
        self.failed = False
        self.endpoint = endpoint
        self.facts = endpoint.facts() if endpoint else None  # the endpoint facts written last
        self.history, self.last_prompt = [], None  # what the log holds, to write it again if it is lost

    def message(self, message: dict, context_tokens: int | None = None, prompt: str | None = None,
                merged: bool = False) -> None:
        """A message that entered the history (merged: it replaced the last one). context_tokens
        is the endpoint's count of the history up to it, so --resume starts exact; prompt is
        what the user typed, for --list and the recap."""
        record = {"type": "replace_last" if merged else "message", "message": message}
        if context_tokens:
            record["context_tokens"] = context_tokens
        if prompt is not None:
            record["prompt"] = prompt
        self.write(record)
        if merged and self.history:
            self.history[-1] = message
        else:
            self.history.append(message)
        if prompt is not None:
            self.header.setdefault("prompt", prompt)  # the first one, for --list if the log is written again
            self.last_prompt = prompt

    def rewrite(self, old: list, new: list, reason: str) -> None:
        """A rewrite of the history, as what changed: runs of the old history and new messages."""
        self.write({"type": "rewrite", "reason": reason, "parts": rewrite_parts(old, new)})
        self.history = list(new)

    def replace(self, messages: list, reason: str, **extra) -> None:
        """The whole history at once (a resumed session starts with it)."""
        self.write({"type": "history", "reason": reason, "messages": messages, **extra})
        self.history, self.last_prompt = list(messages), extra.get("prompt", self.last_prompt)

    def resume_command(self) -> str:
        """The command that comes back to this session, once it holds something to come back to."""
        if self.file is None or self.failed:
            return ""
        return f"{interpreter()} {shlex.quote(sys.argv[0])} --resume"

    def layer(self, name: str, saved_to: list, tokens_saved: int) -> None:
        self.write({"type": "layer", "layer": name, "saved_to": saved_to, "tokens_saved": tokens_saved})

    def write(self, record: dict) -> None:
        if self.failed:
            return
        try:
            records = [] if self.still_open() else self.reopen()
            if self.endpoint and self.endpoint.facts() != self.facts:
                self.facts = self.endpoint.facts()
                records.append({"type": "endpoint", **self.facts})
            for each in records + [record]:
                line = self.secrets.json_text(each)  # a last net: no secret, in any form JSON gives it
                self.file.write(well_formed(line) + "\n")  # a lone half of an emoji cannot be written
            self.file.flush()
            os.fsync(self.file.fileno())
        except (OSError, SessionInUse) as err:
            self.failed = True  # say it once; the session itself goes on
            self.warn(f"[session log] cannot write {self.path} ({err}); this session will not be resumable.")

    def still_open(self) -> bool:
        """Whether the log's path still names the file being written: it may have been
        deleted (with .transcripts/, say), and records written to it would be lost."""
        if self.file is None:
            return False
        try:
            now, opened = os.stat(self.path, follow_symlinks=False), os.fstat(self.file.fileno())
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)

    def reopen(self) -> list:
        """Open the file (create it for a new session); the records to write first: the
        header for a new file, and the history so far if the old file was lost."""
        lost = self.file is not None
        if lost:
            self.file.close()
            self.file = None
        self.file, created = open_log(self.path, new=lost)
        self.lock()
        if not created:
            return []  # a resumed session: appending to its log
        records = [self.header]
        if lost:
            self.warn(f"[session log] {self.path} was deleted while the program ran; it is written again with "
                      f"the session so far, so --resume still finds it.")
            records += [{"type": "endpoint", **self.facts}] if self.facts else []
        if self.history:
            records.append({"type": "history", "reason": "the log was deleted; written again",
                            "messages": self.history, **({"prompt": self.last_prompt} if self.last_prompt else {})})
        return records

    def open(self) -> None:
        """Open an existing log to append, and lock it (a resumed session does this first)."""
        if self.file is None:
            self.file, _ = open_log(self.path, new=False)
            self.lock()

    def lock(self) -> None:
        """Lock the log for as long as it stays open: a second program that tries to continue
        this session is refused (SessionInUse)."""
        try:
            if fcntl:
                fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise SessionInUse(f"Session {self.path.stem.removeprefix('session-')} is open in another program "
                               "right now (two programs would mix their records in its log). Quit that one first, "
                               "or start a new session without --resume.") from None

    def close(self) -> None:
        """Close the log, and so release its lock."""
        if self.file:
            self.file.close()
            self.file = None


def log_records(path: Path):
    """Each line of a session log as a record: a dict, or None for a line that is not a JSON
    object (torn by a crash, or edited). Lines end at newlines only: a record may hold a
    U+2028 in its text, which str.splitlines would also split at."""
    with open(open_regular(path), encoding="utf-8", errors="replace", newline="\n") as f:
        for line in f:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # nested too deep to read is no better
                record = None
            if HALF_ESCAPE.search(line):  # a lone half of an emoji, escaped: U+FFFD from here on
                record = well_formed_deep(record)
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
        with open(open_regular(path, os.O_RDWR), "rb+") as f:
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


def session_logs(workdir: Path, skipped: list | None = None) -> list:
    """This workspace's session logs, oldest first. Only regular files in a real folder are
    logs: a pipe there would block the read forever, a link may lead anywhere. What is
    skipped goes to `skipped`, with the reason."""
    folder, found, skipped = workdir / TRANSCRIPT_DIR, [], [] if skipped is None else skipped
    try:
        mode = os.lstat(folder).st_mode
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(mode):
        skipped.append(f"{TRANSCRIPT_DIR}: {file_kind(mode)}, not a folder")
        return []
    for path in sorted(folder.glob("session-*.jsonl")):
        try:
            info = os.lstat(path)
        except FileNotFoundError:  # deleted since the folder was listed
            continue
        if stat.S_ISREG(info.st_mode):
            found.append((info.st_mtime, path.name, path))
        else:
            skipped.append(f"{TRANSCRIPT_DIR}/{path.name}: {file_kind(info.st_mode)}, not a regular file")
    return [path for *_, path in sorted(found)]


def list_sessions(workdir: Path, width: int | None = None) -> str:
    """A row a session: its id, when it last changed, its size and its first prompt. On a
    terminal narrower than a row, each session takes two lines, cut to the width."""
    rows, skipped = [], []
    for path in session_logs(workdir, skipped):
        try:
            history, first, info = read_session(path, warn=lambda text: print(printable(text))), first_prompt(path), \
                path.stat()
        except OSError as err:  # gone, or replaced, since it was listed
            skipped.append(f"{TRANSCRIPT_DIR}/{path.name}: {err.strerror or err}")
            continue
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.st_mtime))
        prompt = one_line(printable(first), 50) + ("" if was_answered(path) else " (not answered)") if first else "(no prompt yet)"
        session, size = printable(path.stem.removeprefix("session-")), f"{info.st_size / 1024:.1f} KB"
        row = f"  {session:<24} {when}  {counted(len(history), 'message'):>13}  {size:>11}  {prompt}"
        if width and display_width(row) >= width:
            rows += [cut_to_width(f"  {session}  {when}", width - 1),
                     cut_to_width(f"    {counted(len(history), 'message')}, {size}: {prompt}", width - 1)]
        else:
            rows.append(row)
    listed = "Sessions in this workspace (newest last):\n" + "\n".join(rows) if rows else \
        "No sessions in this workspace yet."
    return "\n".join([listed] + [f"  (skipped {printable(why)})" for why in skipped])  # a name may hold escapes


def was_answered(path: Path) -> bool:
    """Whether the model ever replied in a session: its log keeps the replies a /clear or a
    summary took out of the history."""
    return any(r.get("type") in ("message", "replace_last") and isinstance(r.get("message"), dict)
               and r["message"].get("role") == "assistant" for r in filter(None, log_records(path)))


def first_prompt(path: Path) -> str | None:
    """What the user typed first in a session: from the log, which compaction never rewrites."""
    return next((r["prompt"] for r in filter(None, log_records(path)) if isinstance(r.get("prompt"), str)), None)


def unanswered(calls: list) -> list:
    return [{"type": "tool_result", "tool_use_id": c["id"], "is_error": True,
             "content": "Interrupted: the program stopped before this call finished."} for c in calls]


# What the Messages API takes in a block of each type (cache marks aside: the program adds
# its own to each request, and the history never holds one), and who may send it.
BLOCK_KEYS = {"text": {"type", "text", "citations"}, "tool_use": {"type", "id", "name", "input"},
              "tool_result": {"type", "tool_use_id", "content", "is_error"},
              "thinking": {"type", "thinking", "signature"}, "redacted_thinking": {"type", "data"},
              "image": {"type", "source"}, "document": {"type", "source", "title", "context", "citations"}}
REQUIRED = {"thinking": {"thinking": str, "signature": str}, "redacted_thinking": {"data": str},
            "image": {"source": dict}, "document": {"source": dict}}  # (text, tool_use, tool_result: is_message)
SENT_BY = {"tool_use": "assistant", "thinking": "assistant", "redacted_thinking": "assistant", "tool_result": "user"}
REPAIRS = {"dropped": "dropped {}", "renamed": "renamed {}", "text": "turned {} into text",
           "emptied": "replaced {} by {{}}", "answered": "answered {} as interrupted"}


def right_type(value, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) and (kind is not list or all(isinstance(item, str) for item in value))


def clean_block(block: dict, role: str, found: Counter) -> dict | None:
    """A block as the API takes it, or None when it cannot be sent at all. What was dropped
    or changed is counted in found."""
    kind = block.get("type")
    if kind not in BLOCK_KEYS or SENT_BY.get(kind, role) != role:
        found["dropped", "unknown or misplaced block"] += 1
        return None
    program = PROGRAM_FIELDS if isinstance(block.get(OWN), str) else {}  # the program's fields, on its own blocks
    for key in [k for k in block if k not in BLOCK_KEYS[kind]]:
        if key in program and right_type(block[key], program[key]):
            continue
        what = "cache mark" if key == "cache_control" else "bad program marker" if key in PROGRAM_FIELDS \
            else "unknown field"
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
    if not all(isinstance(block.get(key), kind_of) for key, kind_of in REQUIRED.get(kind, {}).items()):
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
    texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)] \
        if isinstance(content, list) else []
    text = "\n".join(texts) if texts else "(no output)" if content is None else json.dumps(content)
    return {**block, "content": text.strip() or "(no output)"}


def clean_message(message: dict, found: Counter) -> dict | None:
    """A message with only what the API takes; None when nothing is left of it (the API
    refuses an empty message, the last assistant one aside, and a new prompt follows that)."""
    if set(message) - {"role", "content"}:
        found["dropped", "unknown field"] += len(set(message) - {"role", "content"})
    content = [b for b in (clean_block(block, message["role"], found) for block in blocks_of(message)) if b] \
        if not isinstance(message["content"], str) or message["content"].strip() else []
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
        results.append(block if match[1]["id"] == block["tool_use_id"] else {**block, "tool_use_id": match[1]["id"]})
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
                repaired.append({"role": "user", "content": answer_calls({"content": []}, calls, found)})
            message, calls = unique_ids(message, used, found)
            if repaired[-1]["role"] == "assistant":  # two replies in a row: the API takes them as one
                message = {**message, "content": blocks_of(repaired.pop()) + blocks_of(message)}
            repaired.append(message)
            continue
        content = answer_calls(message, calls, found)
        calls = []
        if repaired and repaired[-1]["role"] == "user":
            repaired[-1] = {**repaired[-1], "content": blocks_of(repaired[-1]) + content}  # keep the roles alternating
        elif content:
            repaired.append(message if content == blocks_of(message) else {**message, "content": content})
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


def last_prompt(path: Path) -> str | None:
    """What the user typed last in a session, as the log recorded it."""
    prompts = [r["prompt"] for r in filter(None, log_records(path)) if isinstance(r.get("prompt"), str)]
    return prompts[-1] if prompts else None


def open_session(agent, resume: Path | None) -> list:
    """Start a new session log, or continue the one given; return its history."""
    if not resume:
        session = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        agent.log = SessionLog(agent.workdir / TRANSCRIPT_DIR / f"session-{session}.jsonl", agent.secrets,
                               agent.say, session_header(agent, session), agent.endpoint)
        return []
    session, first, last = resume.stem.removeprefix("session-"), first_prompt(resume), last_prompt(resume)
    header = {**session_header(agent, session), **({"prompt": first} if first else {})}  # if written again
    agent.log = SessionLog(resume, agent.secrets, agent.say, header, agent.endpoint)
    agent.log.open()  # before anything is written: a session another program has open is refused (SessionInUse)
    cut = repair_torn_tail(resume)
    if cut:
        agent.say(f"[session log] its last line was cut off when the program stopped; removed it ({cut} bytes)")
    logged, found = read_session(resume, warn=agent.say), Counter()
    history, tokens = repair_history(logged, found), logged_context_tokens(resume)
    if found:  # a log edited by hand, written by an older version, or cut short
        agent.say(f"[session log] repaired what the API would refuse: {what_was_repaired(found)}")
    elif tokens:  # nothing was repaired: the usage still measures it
        agent.state.tokens.anchor(tokens, history)  # so the first pass estimates nothing
    agent.log.replace(history, "resumed", **({"context_tokens": agent.state.tokens.anchor_tokens}
                                             if agent.state.tokens.anchor_tokens else {}),
                      **({"prompt": last} if last else {}))
    agent.say(f"Resumed session {session}: {counted(len(history), 'message')}.")
    for line in recap(last, last_reply_text(history)):  # where the conversation was
        agent.say(line, "dim", cut=True)
    return history


def session_header(agent, session: str) -> dict:
    return {"type": "session", "id": session, "model": agent.settings.model, "window": agent.settings.window,
            "workdir": str(agent.workdir), "endpoint": agent.endpoint.facts()}


def recap(request: str | None, reply: str) -> list:
    return ([f"  you asked: {one_line(request, 200)}"] if request else []) + \
        ([f"  the model: {one_line(reply, 200)}"] if reply else [])
