"""The session log's checks: each line the program writes carries a keyed hash of itself
and of the line before it, so --resume can tell the program's own records from what was
written into the log by anything else: a command that appended a forged user message,
a tool that replaced the file.

The key is 32 random bytes in a file outside the workspace (key_file(), readable by you
only): reading it is a read outside the workspace, which asks first; a line forged
without it never checks out. A key that is missing, empty or damaged (a crash or a full
disk can leave one) is made anew, whole or not at all; logs signed with the old one then
cannot be resumed, and say why. A key that cannot be read or written leaves the session's
log unsigned, and the program says so at start. A line without a valid check is never
resumed, whatever the key's state; so a log with no check at all (an older version's, or
a forged one: they cannot be told apart) is not resumed either.

Machinery the chapter does not need: session_log.py signs each line it writes and reads
a log back through trusted_lines.
"""

import hashlib
import hmac
import os
import secrets
import stat
import time
from contextlib import contextmanager
from pathlib import Path

from ..basics import file_kind, key_file

try:
    import fcntl  # one program at a time makes the key anew
except ImportError:  # Windows: no lock
    fcntl = None

CHECK = "check"                       # the field that holds a line's check
LOCK_SECONDS = 5                      # the longest wait for another program making the key
KEY_BYTES = 32
# Hex characters of an HMAC-SHA256 kept: 64 bits. A forger without the key cannot ask it
# for a check, so each guess is one try against 2**64; longer checks only made the log
# bigger. Logs written before carry 128 bits, still verified as they were written.
CHECK_CHARS = 16
CHECK_LENGTHS = (CHECK_CHARS, 32)


def log_key(create: bool) -> tuple:
    """(the key, "") or (None, why there is none, naming the file and what fixes it). With
    create, a key that is missing, empty or damaged is made anew; one that cannot be read
    (a folder in its place, no permission) is left for a person to fix."""
    path = key_file()
    try:
        return read_key(path), ""
    except FileNotFoundError:
        problem = f"there is no log key at {path}"
    except ValueError:
        problem = f"the log key {path} is empty or damaged"
    except OSError as err:
        fix = "remove it, or make it a file you can read"
        return None, f"the log key {path} cannot be read ({reason(err)}; {fix})"
    if not create:
        return None, problem
    try:
        return new_key(path), ""
    except OSError as err:
        fix = f"make {path.parent} writable"
        return None, f"no log key can be written at {path} ({reason(err)}; {fix})"


def reason(err: OSError) -> str:
    return err.strerror or str(err)


def read_key(path: Path) -> bytes:
    """The key in path. FileNotFoundError when there is none; ValueError when the file holds
    no whole key (empty, cut short, edited); another OSError when it cannot be read."""
    # O_NONBLOCK: a pipe in its place never blocks the start
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(f"{file_kind(mode)} is in its place")
    with open(fd, "rb") as f:
        return whole_key(f.read(4 * KEY_BYTES))


def whole_key(data: bytes) -> bytes:
    key = bytes.fromhex(data.decode("ascii").strip())  # not ASCII, not hex: ValueError too
    if len(key) != KEY_BYTES:  # an empty or cut file is no key
        raise ValueError("not a whole key")
    return key


def new_key(path: Path) -> bytes:
    """A key made and put in place whole: written aside and synced, then renamed over path,
    so a crash leaves the old file or the new key, never an empty one. Under a lock: of two
    programs starting together, the second finds the first one's key and keeps it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with key_lock(path):
        try:
            return read_key(path)
        except (FileNotFoundError, ValueError):
            pass  # still missing or damaged: this program makes it
        key = secrets.token_bytes(KEY_BYTES)
        aside = path.with_name(f".{path.name}-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with open(fd, "w") as f:
                f.write(key.hex())
                f.flush()
                os.fsync(f.fileno())  # on disk before its name is: a crash leaves no empty key
            os.replace(aside, path)
        finally:
            if aside.exists():  # the rename failed
                aside.unlink()
        sync_folder(path.parent)  # the rename on disk too, before a log is signed with the key
        return key


@contextmanager
def key_lock(path: Path, wait: float = LOCK_SECONDS):
    """Held while a key is made, which takes one small write. A program that holds it longer
    (stopped, or hung on a slow disk) is waited for LOCK_SECONDS at most: then this one goes
    on without it, and the rename still leaves one whole key in place."""
    if fcntl is None:
        yield
        return
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)  # a poll: flock has no timeout of its own
        yield
    finally:
        os.close(fd)  # and so the lock is released


def sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows opens no folder: its renames are written through
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_of(key: bytes, previous: str, text: str, chars: int = CHECK_CHARS) -> str:
    signed = (previous + "\n" + text).encode("utf-8", "surrogatepass")
    return hmac.new(key, signed, hashlib.sha256).hexdigest()[:chars]


class Chain:
    """Signs the lines of one log file in order; restart() for a file begun anew. Without
    a key, problem says why, and lines go unsigned."""

    def __init__(self, previous: str = ""):
        self.key, self.problem = log_key(create=True)
        self.previous = previous

    def restart(self, previous: str = "") -> None:
        self.previous = previous

    def signed(self, text: str) -> str:
        """A record's JSON text with its check as the last field (unchanged without a key)."""
        if not self.key or not text.endswith("}"):
            return text
        self.previous = check_of(self.key, self.previous, text)
        return f'{text[:-1]}{", " if text != "{}" else ""}"{CHECK}": "{self.previous}"}}'


def unsigned(line: str) -> tuple:
    """(the line as it was before it was signed, its check) or (line, None)."""
    head, sep, tail = line.rstrip("\n").rpartition(f', "{CHECK}": "')
    check = tail[:-2]
    if not sep or not tail.endswith('"}') or len(check) not in CHECK_LENGTHS:
        return line.rstrip("\n"), None
    return head + "}", check


# Why lines are not resumed. A log's date proves nothing (touch -d): an older version's log
# and a forged one look the same.
NO_CHECKS = ("it carries none of this program's checks: an older version wrote it, or "
             "something else did, so none of it is resumed (its messages are still in the file)")
OTHER_KEY = ("none of its checks match the log key {key}: the key was made anew since (the "
             "old one was lost, emptied or damaged), or another key signed it")
LEFT_OUT = ("{dropped} of its {lines} lines were not written by this program (changed, added "
            "or replaced outside it); they are left out")


def trusted_lines(lines: list) -> tuple:
    """(the lines the program wrote, in order; the last check among them; a line for the
    person when some were not trusted, else ""). A line whose check does not follow from
    the one before it under the key was not written by the program: it is left out, and
    so is every line after a line that went missing. Without a key, or without a check,
    no line is trusted."""
    key, problem = log_key(create=False)
    if not key:
        return [], "", f"none of its lines can be verified: {problem}"
    signed = [unsigned(line) for line in lines]
    if not any(check for _, check in signed):
        return [], "", NO_CHECKS
    kept, previous = [], ""
    for line, (text, check) in zip(lines, signed):
        if check is None:
            continue
        if hmac.compare_digest(check, check_of(key, previous, text, len(check))):
            kept.append(line)
            previous = check
    if not kept:
        return [], "", OTHER_KEY.format(key=key_file())
    if len(kept) == len(lines):
        return kept, previous, ""
    return kept, previous, LEFT_OUT.format(dropped=len(lines) - len(kept), lines=len(lines))


def without_check(record):
    """A record as the program meant it: its check is the log's, not the record's."""
    if not isinstance(record, dict) or CHECK not in record:
        return record
    return {k: v for k, v in record.items() if k != CHECK}
