"""--list: a row for each session in the workspace, with its id, when it last changed, its
size and its first prompt; a log --resume would refuse is listed as one that cannot be
resumed, and what in a log is not trusted is said.

Machinery the chapter does not need: session_log.py finds the logs and reads each back.
"""

import time
from pathlib import Path

from ..basics import TRANSCRIPT_DIR, counted, cut_to_width, display_width, one_line, printable
from .session_log import SessionRefused, first_prompt, log_records, read_session, session_logs


def list_sessions(workdir: Path, width: int | None = None) -> str:
    """A row a session: its id, when it last changed, its size and its first prompt. On a
    terminal narrower than a row, each session takes two lines, cut to the width."""
    rows, skipped = [], []
    for path in session_logs(workdir, skipped):
        try:
            history, first, info = listed_history(path), first_prompt(path), path.stat()
        except OSError as err:  # gone, or replaced, since it was listed
            skipped.append(f"{TRANSCRIPT_DIR}/{path.name}: {err.strerror or err}")
            continue
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.st_mtime))
        prompt, history = listed_prompt(path, first, history), history or []
        session = printable(path.stem.removeprefix("session-"))
        size = f"{info.st_size / 1024:.1f} KB"
        messages = counted(len(history), "message")
        row = f"  {session:<24} {when}  {messages:>13}  {size:>11}  {prompt}"
        if width and display_width(row) >= width:
            rows += [cut_to_width(f"  {session}  {when}", width - 1),
                     cut_to_width(f"    {messages}, {size}: {prompt}", width - 1)]
        else:
            rows.append(row)
    if rows:
        listed = "Sessions in this workspace (newest last):\n" + "\n".join(rows)
    else:
        listed = "No sessions in this workspace yet."
    # a name may hold escapes
    return "\n".join([listed] + [f"  (skipped {printable(why)})" for why in skipped])


def listed_history(path: Path) -> list | None:
    """The history --list counts, saying what in the log is not trusted; None for a log
    --resume would refuse, said in a line too."""
    try:
        return read_session(path, warn=say_plainly)
    except SessionRefused as refused:
        say_plainly(f"[session log] {refused}")
        return None


def say_plainly(text: str) -> None:
    print(printable(text))  # a session's name may hold escapes


def listed_prompt(path: Path, first: str | None, history: list | None) -> str:
    if history is None:
        return "(cannot be resumed)"
    if not first:
        return "(no prompt yet)"
    return one_line(printable(first), 50) + ("" if was_answered(path) else " (not answered)")


def was_answered(path: Path) -> bool:
    """Whether the model ever replied in a session: its log keeps the replies a /clear or a
    summary took out of the history."""
    return any(r.get("type") in ("message", "replace_last") and isinstance(r.get("message"), dict)
               and r["message"].get("role") == "assistant" for r in filter(None, log_records(path)))
