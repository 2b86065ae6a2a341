"""The session log: every message and every rewrite of the history, appended to a
JSON-lines file the moment it happens, so a crash loses at most the line being written;
and reading it back for --resume and --list: only the lines the program wrote and
signed (log_checks.py), repaired where a crash, an edit or an older version broke what
the API takes (log_repair.py). A session is open in one program at a time: the program
that writes a log holds a lock on it.

Machinery the chapter does not need: a SessionLog takes each change as a message, a
rewrite or the whole history, and keeps the layout of a record to itself; log_checks.py
signs each line, and log_repair.py makes what is read back valid.
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
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

from ..compaction import Settings
from ..endpoint import Endpoint
from ..messages import last_reply_text
from .log_checks import Chain, trusted_lines, without_check
from .log_repair import repair_history, what_was_repaired
from ..basics import (HALF_ESCAPE, TRANSCRIPT_DIR, counted, file_kind, one_line, open_log,
                      open_regular, Redactor, well_formed, well_formed_deep)

try:
    import fcntl  # a lock on the log, so two programs never append to one session
except ImportError:  # Windows: no lock
    fcntl = None

# A call record leaves out what most calls repeat, and records_of puts it back, so the log
# grows with content: its limits, when the file's last call record gave the same, and
# these fields at these values.
LIMITS = ("window", "threshold", "micro_trigger", "mark")
CALL_DEFAULTS = {"exact": True}


class SessionRefused(Exception):
    """A session that cannot be resumed, and why."""


class SessionInUse(SessionRefused):
    """Another program has this session open: two writers would interleave their records."""


def interpreter() -> str:
    """How to name the Python that runs this program in a command to type: "python" when
    that is the one the shell finds, else its full path (a virtual environment not
    activated)."""
    # the folder matters: a venv's python links to the one it came from
    found = shutil.which("python")
    same_folder = found and (os.path.dirname(os.path.abspath(found))
                             == os.path.dirname(os.path.abspath(sys.executable)))
    same = same_folder and os.path.realpath(found) == os.path.realpath(sys.executable)
    return "python" if same else shlex.quote(sys.executable)


class SessionLog:
    """An append-only JSON-lines file, flushed to disk after every record. It watches the
    endpoint the session shares with its subagents: what is learned about it (its window,
    say) is recorded before the next record, so --resume starts from it. It also keeps
    the history the log holds so far: if the file is deleted while the program runs, the
    log is written again from it, and --resume still finds the session."""

    def __init__(self, path: Path, secrets=(), warn=print, header: dict | None = None,
                 endpoint=None):
        self.path, self.secrets, self.warn = path, Redactor.of(secrets), warn
        self.header = header or {"type": "session", "id": path.stem.removeprefix("session-")}
        # opened with the first record: a session with no messages leaves no file
        self.file = None
        self.failed = False
        self.endpoint = endpoint
        self.facts = endpoint.facts() if endpoint else None  # the endpoint facts written last
        # what the log holds, to write it again if it is lost
        self.history, self.last_prompt = [], None
        # each line signed, so --resume knows the program's lines from anything else's
        self.chain = Chain()
        self.limits = None  # those the file's last call record gave

    def message(self, message: dict, context_tokens: int | None = None, prompt: str | None = None,
                merged: bool = False) -> None:
        """A message that entered the history (merged: it replaced the last one).
        context_tokens is the endpoint's count of the history up to it, so --resume starts
        exact; prompt is what the user typed, for --list and the recap."""
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
            # the first one, for --list if the log is written again
            self.header.setdefault("prompt", prompt)
            self.last_prompt = prompt

    def rewrite(self, old: list, new: list, reason: str) -> None:
        """A rewrite of the history, as what changed: runs of the old history and new
        messages."""
        self.write({"type": "rewrite", "reason": reason, "parts": rewrite_parts(old, new)})
        self.history = list(new)

    def replace(self, messages: list, reason: str, **extra) -> None:
        """The whole history at once (a resumed session starts with it)."""
        self.write({"type": "history", "reason": reason, "messages": messages, **extra})
        self.history, self.last_prompt = list(messages), extra.get("prompt", self.last_prompt)

    def resume_command(self) -> str:
        """The command that comes back to this session, once it holds something to come back
        to."""
        if self.file is None or self.failed:
            return ""
        return f"{interpreter()} {shlex.quote(sys.argv[0])} --resume"

    def layer(self, name: str, saved_to: list, tokens_saved: int, seconds: float = 0.0) -> None:
        """One layer's run: where it saved what it removed, the tokens it freed, and how long
        the loop spent in it (a summary's call included)."""
        self.write({"type": "layer", "layer": name, "saved_to": saved_to,
                    "tokens_saved": tokens_saved, "seconds": round(seconds, 3)})

    def call(self, size: int, exact: bool, usage: dict, label: str, settings: Settings,
             mark: int | None, seconds: float = 0.0) -> None:
        """One model call: the context it carried, the limits it was held to then (the
        settings, and the early mark of a summary written ahead, if on), what it was billed
        as, how long it took. session_picture.py draws the session from these."""
        self.write({"type": "call", "context_tokens": size, "exact": exact, "usage": usage,
                    "seconds": round(seconds, 3),
                    "what": label, "window": settings.window, "threshold": settings.threshold,
                    "micro_trigger": settings.micro_trigger, "mark": mark})

    def write(self, record: dict) -> None:
        if self.failed:
            return
        try:
            records = [] if self.still_open() else self.reopen()
            if self.endpoint and self.endpoint.facts() != self.facts:
                self.facts = self.endpoint.facts()
                records.append({"type": "endpoint", **self.facts})
            for each in records + [record]:
                each = self.leaner(each)
                # no secret in any form; no lone half of an emoji
                line = well_formed(self.secrets.json_text(each))
                self.file.write(self.chain.signed(line) + "\n")
            self.file.flush()
            os.fsync(self.file.fileno())
        except (OSError, SessionInUse) as err:
            self.failed = True  # say it once; the session itself goes on
            self.warn(f"[session log] cannot write {self.path} ({err}); this session will not be "
                      "resumable.")

    def leaner(self, record: dict) -> dict:
        """A call record without what records_of puts back (CALL_DEFAULTS, LIMITS)."""
        if record.get("type") != "call":
            return record
        limits = {name: record.get(name) for name in LIMITS}
        dropped = {name for name, value in CALL_DEFAULTS.items() if record.get(name) == value}
        if limits == self.limits:
            dropped.update(LIMITS)
        self.limits = limits
        return {k: v for k, v in record.items() if k not in dropped}

    def still_open(self) -> bool:
        """Whether the log's path still names the file being written, as the program left it:
        it may have been deleted (with .transcripts/, say), replaced or rewritten, and
        records written to it would be lost, or follow lines that are not the program's."""
        if self.file is None:
            return False
        try:
            now, opened = os.stat(self.path, follow_symlinks=False), os.fstat(self.file.fileno())
        except OSError:
            return False
        same_file = (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)
        return same_file and opened.st_size == self.file.tell()

    def reopen(self) -> list:
        """Open the file (create it for a new session); the records to write first: the
        header for a new file, and the history so far if the old file was lost."""
        lost = self.file is not None
        if lost:
            self.file.close()
            self.file = None
        # replaced by something else: kept aside, never appended to
        found = lost and os.path.lexists(self.path)
        if found:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            aside = self.path.with_name(f"{self.path.name}.replaced-{stamp}")
            # twice in a second: neither overwritten
            names = (aside.with_name(f"{aside.name}-{n}" if n else aside.name) for n in range(1000))
            kept = next(k for k in names if not k.exists())
            os.rename(self.path, kept)
        self.file, created = open_log(self.path, new=lost)
        self.lock()
        if not created:
            return []  # a resumed session: appending to its log
        self.chain.restart()
        self.limits = None  # a new file: its first call record gives them
        records = [self.header]
        if lost:
            if found:
                what = f"replaced or changed (what was found there is kept as {kept.name})"
            else:
                what = "deleted"
            self.warn(f"[session log] {self.path} was {what} while the program ran; it is written "
                      f"again with the session so far, so --resume still finds it.")
            records += [{"type": "endpoint", **self.facts}] if self.facts else []
        if self.history:
            prompt = {"prompt": self.last_prompt} if self.last_prompt else {}
            records.append({"type": "history", "reason": "the log was lost; written again",
                            "messages": self.history, **prompt})
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
            session = self.path.stem.removeprefix("session-")
            raise SessionInUse(f"Session {session} is open in another program right now (two "
                               "programs would mix their records in its log). Quit that one "
                               "first, or start a new session without --resume.") from None

    def close(self) -> None:
        """Close the log, and so release its lock."""
        if self.file:
            self.file.close()
            self.file = None


def log_lines(path: Path) -> list:
    """A session log's lines. They end at newlines only: a record may hold a U+2028 in its
    text, which str.splitlines would also split at."""
    with open(open_regular(path), encoding="utf-8", errors="replace", newline="\n") as f:
        return list(f)


def records_of(lines):
    """Each line as a record: a dict, or None for a line that is not a JSON object (torn by
    a crash, or edited). A call record comes whole, with what SessionLog.leaner left out."""
    limits = {}
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # nested too deep to read is no better
            record = None
        if HALF_ESCAPE.search(line):  # a lone half of an emoji, escaped: U+FFFD from here on
            record = well_formed_deep(record)
        if not isinstance(record, dict):
            yield None
            continue
        if record.get("type") == "call":
            record = {**CALL_DEFAULTS, **limits, **record}
            limits = {name: record.get(name) for name in LIMITS}
        yield without_check(record)


def log_records(path: Path):
    """The records of the lines the program wrote: nothing else in a log is believed."""
    lines, _, _ = trusted_lines(log_lines(path))
    return records_of(lines)


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
        isinstance(b, dict)
        and all(isinstance(b.get(k), str) for k in BLOCK_FIELDS.get(b.get("type"), ("type",)))
        for b in content)


def read_session(path: Path, warn=None, chain: Chain | None = None) -> list:
    """Replay a session log into the history it last held, from the lines the program wrote
    (log_checks.py): a line anything else wrote or changed is left out, and warn() says so.
    A line that is not a whole, well-formed record (torn by a crash) is skipped, and warn()
    says how many. A chain given goes on from the last line trusted."""
    lines, last, problem = trusted_lines(log_lines(path))
    if problem and not lines:
        raise SessionRefused(f"Session {path.stem.removeprefix('session-')} is not resumed: "
                             f"{problem}. Start a new session without --resume (the file is left "
                             "as it is).")
    if problem and warn:
        warn(f"[session log] {path.name}: {problem}")
    if chain:
        chain.restart(last)
    history, skipped = [], 0
    for record in records_of(lines):
        kind = record.get("type") if record else None
        if kind == "message" and is_message(record.get("message")):
            history.append(record["message"])
        elif kind == "replace_last" and history and is_message(record.get("message")):
            history[-1] = record["message"]
        elif kind == "history" and isinstance(record.get("messages"), list) and \
                all(is_message(m) for m in record["messages"]):
            history = record["messages"]
        elif kind == "rewrite":
            rewritten = apply_rewrite(history, record.get("parts"))
            if rewritten is None:
                skipped += 1
            else:
                history = rewritten
        elif kind not in ("session", "endpoint", "layer", "call"):
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
            kind = file_kind(info.st_mode)
            skipped.append(f"{TRANSCRIPT_DIR}/{path.name}: {kind}, not a regular file")
    return [path for *_, path in sorted(found)]


def first_prompt(path: Path) -> str | None:
    """What the user typed first in a session: from the log, which compaction never rewrites."""
    return next((r["prompt"] for r in filter(None, log_records(path))
                 if isinstance(r.get("prompt"), str)), None)


def find_session(workdir: Path, wanted: str) -> Path:
    """The log of session `wanted` ("latest": the newest); ValueError when there is none."""
    logs = session_logs(workdir)
    if not logs:
        raise ValueError(f"No sessions in {workdir} yet: start one without --resume.")
    if wanted == "latest":
        return logs[-1]
    # a prefix will do
    found = [path for path in logs if path.stem.removeprefix("session-").startswith(wanted)]
    if len(found) != 1:
        how_many = "No" if not found else "More than one"
        raise ValueError(f"{how_many} session {wanted!r} in {workdir / TRANSCRIPT_DIR}; "
                         "--list shows them.")
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
    prompts = [r["prompt"] for r in filter(None, log_records(path))
               if isinstance(r.get("prompt"), str)]
    return prompts[-1] if prompts else None


@dataclass(frozen=True)
class LogSetup:
    """What a session log is opened with: the workspace it lives in, what its header records
    (the model and window of the settings, the endpoint's facts, which it also watches), the
    secrets that never go in it, and how a problem with it is said."""
    workdir: Path
    settings: Settings
    endpoint: Endpoint
    secrets: Redactor
    say: Callable[..., None]


def open_session_log(setup: LogSetup, resume: Path | None, counter) -> tuple:
    """(a new session log, or the one given continued; its history). A resumed history the
    usage still measures anchors the loop's token counter (counter)."""
    say = setup.say
    if not resume:
        session = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        log = SessionLog(setup.workdir / TRANSCRIPT_DIR / f"session-{session}.jsonl", setup.secrets,
                         say, session_header(setup, session), setup.endpoint)
        unsigned = log.chain.problem
        if unsigned:  # said at start, not found out at --resume
            say(f"[session log] {unsigned}: this session's log is unsigned, "
                "and --resume will refuse it.")
        return log, []
    session = resume.stem.removeprefix("session-")
    first, last = first_prompt(resume), last_prompt(resume)
    # if written again
    header = {**session_header(setup, session), **({"prompt": first} if first else {})}
    log = SessionLog(resume, setup.secrets, say, header, setup.endpoint)
    # before anything is written: a session another program has open is refused (SessionInUse)
    log.open()
    cut = repair_torn_tail(resume)
    if cut:
        say(f"[session log] its last line was cut off when the program stopped; removed it "
            f"({cut} bytes)")
    logged, found = read_session(resume, warn=say, chain=log.chain), Counter()
    history, counted_tokens = repair_history(logged, found), logged_context_tokens(resume)
    if found:  # a log edited by hand, written by an older version, or cut short
        say(f"[session log] repaired what the API would refuse: {what_was_repaired(found)}")
    elif counted_tokens:  # nothing was repaired: the usage still measures it
        counter.anchor(counted_tokens, history)  # so the first pass estimates nothing
    measured = {"context_tokens": counter.anchor_tokens} if counter.anchor_tokens else {}
    log.replace(history, "resumed", **measured, **({"prompt": last} if last else {}))
    say(f"Resumed session {session}: {counted(len(history), 'message')}.")
    for line in recap(last, last_reply_text(history)):  # where the conversation was
        say(line, "dim", cut=True)
    return log, history


def session_header(setup: LogSetup, session: str) -> dict:
    return {"type": "session", "id": session, "model": setup.settings.model,
            "window": setup.settings.window, "workdir": str(setup.workdir),
            "endpoint": setup.endpoint.facts()}


def recap(request: str | None, reply: str) -> list:
    return ([f"  you asked: {one_line(request, 200)}"] if request else []) + \
        ([f"  the model: {one_line(reply, 200)}"] if reply else [])
