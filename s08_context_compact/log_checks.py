"""The session log's checks: each line the program writes carries a keyed hash of itself
and of the line before it, so --resume can tell the program's own records from what was
written into the log by anything else: a command that appended a forged user message,
a tool that replaced the file.

The key is 32 random bytes in a file outside the workspace (KEY_FILE, readable by you
only): reading it is a read outside the workspace, which asks first; a line forged
without it never checks out. A log with no check at all (an older version's, or a forged
one: they cannot be told apart) is not resumed.

Machinery the chapter does not need: session_log.py signs each line it writes and reads
a log back through trusted_lines.
"""

import hashlib
import hmac
import os
import secrets
from pathlib import Path

CHECK = "check"                       # the field that holds a line's check
CHECK_CHARS = 32                      # hex characters of an HMAC-SHA256 kept: 128 bits


def key_file() -> Path:
    """Where the key lives: $XDG_STATE_HOME/s08/log-key, else ~/.local/state/s08/log-key."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "s08" / "log-key"


def log_key(create: bool) -> bytes | None:
    """The key, made (readable by you only) when create and it is missing; None when it
    cannot be had (a home that cannot be written)."""
    path = key_file()
    try:
        return whole_key(path.read_text())
    except (OSError, ValueError):
        if not create:
            return None
    try:  # written aside, then linked in place whole: another program never reads it half written
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        aside = path.with_name(f".log-key-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(aside, path)  # fails if another program made it first: theirs is the key
        finally:
            aside.unlink()
        return whole_key(path.read_text())
    except (OSError, ValueError):
        return log_key(create=False)  # another program made it first, or none can be made


def whole_key(text: str) -> bytes:
    key = bytes.fromhex(text.strip())
    if len(key) != 32:  # an empty or cut file is no key
        raise ValueError("not a whole key")
    return key


def check_of(key: bytes, previous: str, text: str) -> str:
    return hmac.new(key, (previous + "\n" + text).encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[
        :CHECK_CHARS]


class Chain:
    """Signs the lines of one log file in order; restart() for a file begun anew."""

    def __init__(self, previous: str = ""):
        self.key, self.previous = log_key(create=True), previous

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
    if not sep or not tail.endswith('"}') or len(tail) != CHECK_CHARS + 2:
        return line.rstrip("\n"), None
    return head + "}", tail[:-2]


def trusted_lines(lines: list) -> tuple:
    """(the lines the program wrote, in order; the last check among them; a line for the
    person when some were not trusted, else ""). A line whose check does not follow from
    the one before it was not written by the program: it is left out, and so is every
    line after a line that went missing. A log with no check at all is trusted only where
    no key exists yet (nothing has signed a log here before)."""
    key = log_key(create=False)
    signed = [unsigned(line) for line in lines]
    if not any(check for _, check in signed):
        if key:  # its date proves nothing (touch -d): an older version's log and a forged one look the same
            return [], "", ("it carries none of this program's checks: an older version wrote it, or something "
                            "else did, so none of it is resumed (its messages are still in the file)")
        return lines, "", ""
    if not key:
        return lines, "", f"its checks cannot be verified: the key {key_file()} is gone; resumed without them"
    kept, previous, dropped = [], "", 0
    for line, (text, check) in zip(lines, signed):
        if check is not None and hmac.compare_digest(check, check_of(key, previous, text)):
            kept.append(line)
            previous = check
        else:
            dropped += 1
    if not dropped:
        return kept, previous, ""
    return kept, previous, (f"{dropped} of its {len(lines)} lines were not written by this program (changed, added "
                            "or replaced outside it); they are left out")


def without_check(record):
    """A record as the program meant it: its check is the log's, not the record's."""
    return {k: v for k, v in record.items() if k != CHECK} if isinstance(record, dict) and CHECK in record else record
