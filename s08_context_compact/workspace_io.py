"""Safe file and command I/O in the workspace: paths that cannot escape it, writes that
leave the old file whole when they fail, command output captured to disk as it arrives,
and files read line by line however big they are.

Machinery the chapter does not need: the tools in code.py call these.
"""

import os
import re
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from redaction import SECRET_NAME, redact_bytes

BASH_OUTPUT_HEAD = 200_000          # characters of command output kept in memory...
BASH_OUTPUT_TAIL = 20_000           # ...plus the last ones, so errors at the end survive
READ_MAX_CHARS = 200_000            # one read_file call returns at most this much
READ_MAX_LINE_CHARS = 2_000         # minified files: cut single lines, not whole reads


def inside_workspace(workdir: Path, path: str) -> Path | None:
    """Resolve a path (symlinks included); None when it lands outside the workspace."""
    root = workdir.resolve()
    target = (root / path).resolve()
    return target if target == root or target.is_relative_to(root) else None


def output_names(folder: Path, tool_use_id: str):
    """Where a tool call's output may go: <id>.txt, then <id>-1.txt, ... (a bounded number)."""
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", tool_use_id)[:80] or "result"
    for attempt in range(1000):
        yield folder / (f"{stem}.txt" if attempt == 0 else f"{stem}-{attempt}.txt")


def run_command(command: str, *, cwd: Path, timeout: int, outputs: Path, secrets: list, call_id: str) -> str:
    """Run a shell command; its output with an exit-code or timeout note.

    A new session makes the command its own process group, so a timeout (or Ctrl-C) kills
    everything it started, not just the shell. Secret variables are not passed on: `env`
    must not be one call away from the key."""
    environment = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, stdin=subprocess.DEVNULL, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    captured = CapturedOutput(outputs, secrets)
    reader = threading.Thread(target=captured.drain, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        code, timed_out = proc.wait(), True
    except KeyboardInterrupt:
        kill_group(proc)
        captured.finish(None)
        raise
    reader.join(timeout=0.5)  # a background child may keep the pipe open; do not wait for it
    saved = captured.finish(call_id)
    parts = [captured.text(saved and saved.relative_to(cwd)).strip("\n")]
    if timed_out:
        parts.append(f"[timed out after {timeout}s; the command and its children were killed]")
    elif code != 0:
        parts.append(f"[exit code {code}]")
    return "\n".join(p for p in parts if p) or "(no output)"


def kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class CapturedOutput:
    """A command's output as it arrives. Every byte goes to a file in the tool-results
    folder, secrets redacted on the way; only the head and the tail stay in memory, so
    100 MB of output costs what 220 KB does. The file is kept only when the output was
    too long to show whole."""

    def __init__(self, folder: Path, secrets: list):
        self.folder, self.file, self.unsaved = folder, None, None
        self.secrets = sorted({v.encode("utf-8", "surrogatepass") for v in secrets}, key=len, reverse=True)
        self.overlap = max(map(len, self.secrets), default=1) - 1  # a secret may straddle two chunks
        self.carry, self.head, self.tail, self.total = b"", bytearray(), bytearray(), 0
        self.lock, self.done = threading.Lock(), False

    def drain(self, pipe) -> None:
        while chunk := pipe.read1(65536):
            with self.lock:
                if self.done:
                    return
                data = redact_bytes(self.carry + chunk, self.secrets)
                cut = max(len(data) - self.overlap, 0)
                self.carry = data[cut:]
                self.keep(data[:cut])

    def keep(self, data: bytes) -> None:
        self.total += len(data)
        room = BASH_OUTPUT_HEAD - len(self.head)
        self.head += data[:max(room, 0)]
        if room < len(data):
            self.tail = (self.tail + data[max(room, 0):])[-BASH_OUTPUT_TAIL:]
        if self.unsaved is None and data:
            try:
                if self.file is None:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    self.file = tempfile.NamedTemporaryFile(dir=self.folder, prefix=".bash-", suffix=".partial",
                                                            delete=False)
                self.file.write(data)
            except OSError as err:
                self.unsaved = err  # the head and tail are still shown; the note says the rest is lost

    def finish(self, tool_use_id: str | None) -> Path | None:
        """Stop reading; keep the file under the call's id if the output was cut, else remove it."""
        with self.lock:
            self.done = True
            self.keep(self.carry)
            self.carry = b""
            if self.file is None:
                return None
            self.file.close()
            partial = Path(self.file.name)
            try:
                if tool_use_id is None or self.total <= len(self.head) or self.unsaved:
                    partial.unlink(missing_ok=True)
                    return None
                return keep_as(partial, self.folder, tool_use_id)
            except OSError as err:
                self.unsaved = err
                return None

    def text(self, saved: Path | None) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.tail:
            return head
        omitted = self.total - len(self.head) - len(self.tail)
        where = f"the whole output is saved at {saved}; read_file (offset/limit) or grep it for the part you need" \
            if saved else "redirect the output to a file and read the part you need"
        return f"{head}\n[... {omitted:,} bytes of output omitted ({self.total:,} in all); {where} ...]\n" + \
            self.tail.decode("utf-8", "replace")


def keep_as(partial: Path, folder: Path, tool_use_id: str) -> Path:
    """Give a finished file its name, <id>.txt (or <id>-N.txt), never replacing another."""
    for target in output_names(folder, tool_use_id):
        try:
            os.link(partial, target)  # fails, rather than replaces, if the name is taken
        except FileExistsError:
            continue
        except OSError:  # a file system without hard links
            if target.exists():
                continue
            os.replace(partial, target)
            return target
        partial.unlink()
        return target
    return partial


def bounded_lines(f):
    """Lines of a binary file, each cut to a few KB: a 1 GB file with no newline never
    lands in memory whole."""
    while raw := f.readline(READ_MAX_LINE_CHARS * 4):
        if not raw.endswith(b"\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass  # skip the rest of an overlong line, a megabyte at a time
        yield raw


def numbered_lines(f, path: str, offset: int, limit: int) -> str:
    # Reads line by line, so a 1 GB file costs only the lines asked for.
    out, size, number = [], 0, 0
    for number, raw in enumerate(bounded_lines(f), start=1):
        if number < offset:
            continue
        if number >= offset + limit or size > READ_MAX_CHARS:
            out.append(f"[more lines follow; call read_file with offset={number} to continue]")
            break
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if len(line) > READ_MAX_LINE_CHARS:
            line = line[:READ_MAX_LINE_CHARS] + f" [line cut at {READ_MAX_LINE_CHARS} chars]"
        out.append(f"{number:>6}\t{line}")
        size += len(line) + 8
    if not out:
        return f"(empty: {path} has {number} lines; offset {offset} is past the end)" if number \
            else f"(empty file: {path})"
    return "\n".join(out)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(target: Path, data: bytes) -> None:
    """Write beside the target, flush to disk, then rename over it: a write that fails
    half-way (a full disk, say) leaves the original file exactly as it was."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~current_umask()
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, mode)  # the file keeps its permissions (a new one gets the usual ones)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def printable(name: str) -> str:
    """A file name whose bytes are not UTF-8, with those bytes shown as \ufffd: it can be
    printed, logged and sent (an undecodable name arrives with lone surrogates)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
