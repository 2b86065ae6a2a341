"""The session log: every message and every rewrite of the history, appended to a
JSON-lines file the moment it happens, so a crash loses at most the line being written;
and reading it back for --resume and --list, repairing what a crash or an edit broke.

Machinery the chapter does not need: code.py calls agent.log.message(...) and
agent.log.rewrite(...), and never sees a record's layout.
"""

import json
import os
import time
import uuid
from pathlib import Path

from redaction import redact
from terminal import counted, cut_to_width, display_width, one_line, printable

TRANSCRIPT_DIR = ".transcripts"


class SessionLog:
    """An append-only JSON-lines file, flushed to disk after every record. It watches the
    endpoint the session shares with its subagents: what is learned about it (its window,
    say) is recorded before the next record, so --resume starts from it."""

    def __init__(self, path: Path, secrets: list = (), warn=print, header: dict | None = None, endpoint=None):
        self.path, self.secrets, self.warn = path, list(secrets), warn
        self.header = header  # written with the first record: a session with no messages leaves no file
        self.file = None
        self.failed = False
        self.endpoint = endpoint
        self.facts = endpoint.facts() if endpoint else None  # the endpoint facts written last

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

    def rewrite(self, old: list, new: list, reason: str) -> None:
        """A rewrite of the history, as what changed: runs of the old history and new messages."""
        self.write({"type": "rewrite", "reason": reason, "parts": rewrite_parts(old, new)})

    def layer(self, name: str, saved_to: list, tokens_saved: int) -> None:
        self.write({"type": "layer", "layer": name, "saved_to": saved_to, "tokens_saved": tokens_saved})

    def write(self, record: dict) -> None:
        if self.failed:
            return
        if self.header:
            header, self.header = self.header, None
            self.write(header)
            if self.failed:
                return
        if self.endpoint and self.endpoint.facts() != self.facts:
            self.facts = self.endpoint.facts()
            self.write({"type": "endpoint", **self.facts})
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
        prompt = one_line(printable(first), 50) + ("" if history else " (not answered)") if first else "(no prompt yet)"
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
    return next((r["prompt"] for r in filter(None, log_records(path)) if isinstance(r.get("prompt"), str)), None)


def blocks(message: dict) -> list:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def tool_uses(message: dict) -> list:
    return [b for b in blocks(message) if b.get("type") == "tool_use"]


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
        calls = tool_uses(previous) if previous and previous["role"] == "assistant" else []
        if message["role"] == "assistant":
            if previous is None:
                continue  # a history starts with the user
            if calls:
                repaired.append({"role": "user", "content": unanswered(calls)})
            repaired.append({**message, "content": [{**b, "input": {}} if b.get("type") == "tool_use" and not
                                                    isinstance(b.get("input"), dict) else b for b in blocks(message)]})
            continue
        ids = {c["id"] for c in calls}
        results = [b for b in blocks(message) if b.get("type") == "tool_result" and b["tool_use_id"] in ids]
        results += unanswered([c for c in calls if c["id"] not in {r["tool_use_id"] for r in results}])
        content = results + [b for b in blocks(message) if b.get("type") != "tool_result"]
        if previous is not None and previous["role"] == "user":
            repaired[-1] = {**previous, "content": blocks(previous) + content}  # keep the roles alternating
        elif content:
            repaired.append({**message, "content": content})
    if repaired and repaired[-1]["role"] == "assistant" and tool_uses(repaired[-1]):
        repaired.append({"role": "user", "content": unanswered(tool_uses(repaired[-1]))})
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
        header = {"type": "session", "id": session, "model": agent.settings.model,
                  "window": agent.settings.window, "workdir": str(agent.workdir), "endpoint": agent.endpoint.facts()}
        agent.log = SessionLog(agent.workdir / TRANSCRIPT_DIR / f"session-{session}.jsonl", agent.secrets,
                               agent.say, header, agent.endpoint)
        return []
    cut = repair_torn_tail(resume)
    if cut:
        agent.say(f"[session log] its last line was cut off when the program stopped; removed it ({cut} bytes)")
    logged = read_session(resume, warn=agent.say)
    history, tokens = repair_history(logged), logged_context_tokens(resume)
    if tokens and len(history) == len(logged):  # nothing was repaired: the usage still measures it
        agent.state.tokens.anchor(tokens, history)  # so the first pass estimates nothing
    agent.log = SessionLog(resume, agent.secrets, agent.say, endpoint=agent.endpoint)
    agent.log.write({"type": "history", "reason": "resumed", "messages": history,
                     **({"context_tokens": agent.state.tokens.anchor_tokens} if agent.state.tokens.anchor_tokens
                        else {})})
    agent.say(f"Resumed session {resume.stem.removeprefix('session-')}: {counted(len(history), 'message')}.")
    reply = next((b["text"] for m in reversed(history) if m["role"] == "assistant"
                  for b in reversed(blocks(m)) if b.get("type") == "text"), "")
    for line in recap(last_prompt(resume), reply):  # where the conversation was
        agent.say(line, "dim", cut=True)
    return history


def recap(request: str | None, reply: str) -> list:
    return ([f"  you asked: {one_line(request, 200)}"] if request else []) + \
        ([f"  the model: {one_line(reply, 200)}"] if reply else [])
