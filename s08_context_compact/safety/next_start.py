"""What the next start trusts, when a command could have changed it. The sandbox pins what it
can: a file or folder it binds is a mount point, which no command can change, remove or move.
A link cannot be pinned: a command removes it and puts a file of its own in its place. So each
place the next start reads that lies in the workspace (the program's own .env, the history
file) is watched: how it looked when the session began is written down where no command
reaches (the state folder), looked at again after every command, and a change is recorded as
the command's. The next start reads those records and does not trust a place a command
changed until a person saves it again (anything a person does to it sets a new ctime, which
no command can set back). The program's own writes are looked at the same way (a file
tool's, /undo's and /redo's, which may reach the place through another name it has): only
a person's save, made while the program does not run, makes the place trusted again.

Machinery the chapter does not need: a Watch looks again after each tool call, /undo and
/redo (sandbox.py's Sandbox.look_again), and changed_by_command says why the program's own
.env or the prompt history is not to be trusted, before either is read.
"""

import atexit
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..basics import state_folder

MAX_HOPS = 40                       # links followed while resolving a path, as the kernel does


def records() -> Path:
    """The folder of records: in the state folder, which commands never see."""
    return state_folder() / "next-start"


def resolution(path) -> tuple:
    """(every link met while resolving path, component by component, as (link, its text);
    the real path, or None for a loop). What the kernel does for open(), written out, so a
    caller can ask where each link lies."""
    pending, real, links = list(Path(os.path.abspath(path)).parts[1:]), "/", []
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        here = os.path.dirname(real) if part == ".." else os.path.join(real, part)
        try:
            info = os.lstat(here)
        except OSError:  # missing from here on: the rest is taken as written
            return links, os.path.join(here, *pending)
        if not stat.S_ISLNK(info.st_mode):
            real = here
            continue
        if len(links) >= MAX_HOPS:
            return links, None
        text = os.readlink(here)
        links.append((here, text))
        base = "/" if os.path.isabs(text) else real
        pending = list(Path(text).parts[1 if os.path.isabs(text) else 0:]) + pending
        real = base
    return links, real


def passes_through(path, folder: str) -> list:
    """The links inside folder (a real path) that path's resolution depends on: a command
    that can write in folder can point each of them elsewhere."""
    links = [link for link, _ in resolution(path)[0]]
    return [link for link in links if contains(folder, os.path.realpath(os.path.dirname(link)))]


def fingerprint(path) -> list:
    """How a place looks, without reading it: each link on the way, and what it ends at
    (its kind, inode, number of names, size and times; ctime changes with any write and
    cannot be set back)."""
    links, real = resolution(path)
    try:
        info = os.lstat(real) if real else None
    except OSError:
        info = None
    if info is None:
        end = ["missing"]
    else:
        end = [stat.S_IFMT(info.st_mode), info.st_dev, info.st_ino, info.st_nlink,
               info.st_size, info.st_mtime_ns, info.st_ctime_ns]
    return [[link, text] for link, text in links] + [end]


def contains(folder: str, path: str) -> bool:
    """Whether path (a real path) is folder or lies inside it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def record_name(path) -> str:
    return hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:24]


def write_record(path: Path, content: dict) -> None:
    """A record written whole or not at all, its folder readable by you only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(content, f)
    os.replace(part, path)


def read_record(path: Path) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, encoding="utf-8") as f:
            content = json.loads(f.read(1_000_000))
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def started_at(pid) -> str:
    """When a process started, as /proc tells it ("" where there is no /proc): with its pid,
    what names it, as a pid alone is reused (after a reboot, by another program)."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # the 22nd field, after the name
    except (OSError, ValueError, TypeError, OverflowError, IndexError):
        return ""


def process_alive(session: dict) -> bool:
    """Whether the program that wrote a session's record still runs."""
    pid = session.get("pid")
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError, OverflowError):
        return False
    return started_at(pid) == session.get("started", "")


def changed_by_command(path) -> str:
    """Why the next start should not trust path ("" when nothing says a command changed it):
    a change recorded after a command, or one found now against a session that ended
    without looking (it was killed) or is still running."""
    path, now = os.path.abspath(path), fingerprint(path)
    settle_sessions_that_ended()
    mark = records() / f"changed-{record_name(path)}.json"
    changed = read_record(mark)
    if changed and changed.get("path") == path:
        if changed.get("fingerprint") == now:
            when = changed.get("when", "at an unknown time")
            return (f"it was changed while the program ran ({when}), by a command, a file tool "
                    "or /undo")
        try:
            mark.unlink()  # changed again since, by no command: a person's save
        except OSError:
            pass
    for session in running_sessions():
        if path in session.get("places", {}) and session["places"][path] != now:
            return (f"it changed while the program (pid {session.get('pid')}) runs commands in "
                    "this folder")
    return ""


def session_files() -> list:
    try:
        return sorted(records().glob("session-*.json"))
    except OSError:
        return []


def running_sessions() -> list:
    return [s for s in map(read_record, session_files()) if s and process_alive(s)]


def settle_sessions_that_ended() -> None:
    """A session that ended without looking after its last command (killed): what differs
    now from how it began is recorded as a command's change."""
    for file in session_files():
        session = read_record(file)
        if session and process_alive(session):
            continue
        for path, began in (session or {}).get("places", {}).items():
            if fingerprint(path) != began:
                mark_changed(path, "in a session that ended without a clean exit")
        try:
            file.unlink()
        except OSError:
            pass


def mark_changed(path: str, when: str) -> None:
    try:
        write_record(records() / f"changed-{record_name(path)}.json",
                     {"path": path, "fingerprint": fingerprint(path), "when": when})
    except OSError:
        pass  # the line said now is all that can be done


@dataclass
class Watch:
    """The places a command could change that the next start reads, as the session found
    them. begin() writes them down; look_again() looks at them again."""
    places: tuple = ()
    began: dict = field(default_factory=dict)
    file: Path | None = None
    problem: str = ""                  # why nothing could be written down ("" when it was)

    def begin(self) -> "Watch":
        self.began = {os.path.abspath(p): fingerprint(p) for p in self.places}
        if not self.began:
            return self
        self.file = records() / f"session-{os.getpid()}-{time.time_ns()}.json"
        try:
            write_record(self.file, {"pid": os.getpid(), "started": started_at(os.getpid()),
                                     "places": self.began})
        except OSError as err:
            self.file, self.problem = None, f"{records()}: {err.strerror or err}"
            return self
        atexit.register(self.end, os.getpid())
        return self

    def look_again(self) -> list:
        """The watched places a command (or a tool, or /undo) just changed, each recorded for the
        next start."""
        changed = [path for path, began in self.began.items() if fingerprint(path) != began]
        for path in changed:
            mark_changed(path, time.strftime("%Y-%m-%d %H:%M", time.localtime()))
            self.began[path] = fingerprint(path)  # said once; the record stands for the next start
        return changed

    def end(self, maker: int | None = None) -> None:
        if self.file and (maker is None or maker == os.getpid()):
            try:
                self.file.unlink()
            except OSError:
                pass
            self.file = None
