"""Running a command of the bash tool: its output captured to disk as it arrives, secrets
redacted on the way, only its head and tail kept in memory; its whole process tree ended
with it, on a timeout, Ctrl-C or a signal to the program, those started with setsid
included.

Machinery the chapter does not need: run_command returns the text the model reads, and
sandbox.py decides how the command starts, confined or as it is.
"""

import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from ..basics import output_names, own_folder, Redactor, TOOL_RESULTS_DIR
from .sandbox import Sandbox

BASH_OUTPUT_HEAD = 200_000          # characters of command output kept in memory...
BASH_OUTPUT_TAIL = 20_000           # ...plus the last ones, so errors at the end survive


def run_command(command: str, *, cwd: Path, timeout: int, secrets, call_id: str,
                sandbox: Sandbox = Sandbox(), outputs: Path | None = None) -> str:
    """Run a shell command; its output with an exit-code or timeout note.

    The command gets a session of its own, so its process group is everything it started
    but what left the group (setsid); /proc shows those too (ProcessTree). A timeout, Ctrl-C,
    or SIGTERM/SIGHUP to the program (raised here as an exception) ends them all.
    Secrets and the program's own settings are not passed on (Sandbox.environment). In the
    sandbox (sandbox.py), its own PID namespace ends whatever the command left running.
    Output too long to show is saved in `outputs` (the workspace's TOOL_RESULTS_DIR)."""
    outputs = outputs or cwd / TOOL_RESULTS_DIR
    captured = CapturedOutput(cwd, outputs.relative_to(cwd), secrets)
    tree = ProcessTree(sandbox.wrappers)
    start = sandbox.start(command, cwd, dict(os.environ))
    try:
        proc = subprocess.Popen(start.argv, cwd=cwd, stdin=subprocess.DEVNULL, env=start.env,
                                pass_fds=start.fds, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        start.close()
    reader = threading.Thread(target=captured.drain, args=(proc.stdout,), daemon=True)
    # from here on, whatever interrupts (even while a thread starts) ends the command's processes
    try:
        tree.start_watching(proc.pid)
        reader.start()
        code, ended = proc.wait(timeout=timeout), None
    except subprocess.TimeoutExpired:
        ended = tree.end(proc)
        code = proc.wait()
    except BaseException as stop:
        # Ctrl-C, SIGTERM, SIGHUP: nothing the command started keeps running
        shown = " ".join(command.split())[:60]
        note = f"The running command ({shown}) {ended_what(tree.end(proc))}."
        # add_note(), which Python 3.10 lacks
        stop.__notes__ = [*getattr(stop, "__notes__", []), note]
        captured.finish(None)
        raise
    finally:
        tree.done.set()
        # however it ended: a change is recorded for the next start
        changed = sandbox.look_again()
    reader.join(timeout=0.5)  # a background child may keep the pipe open; do not wait for it
    saved = captured.finish(call_id)
    shown = captured.as_result(saved and saved.relative_to(cwd)).strip("\n")
    parts = [shown + sandbox.explain(shown, command, cwd) + changed]
    if ended is not None:
        parts.append(f"[timed out after {timeout}s; the command {ended_what(ended)}]")
    elif code != 0:
        parts.append(f"[exit code {code}]")
    return "\n".join(p for p in parts if p) or "(no output)"


def ended_what(count: int) -> str:
    """What ProcessTree.end() ended, truthfully."""
    if count < 0:
        return ("was ended with its process group; a process it started that left the group "
                "(setsid) may still run, as this system has no /proc to find it")
    if not count:
        return "was ended"
    return f"and the {count} process{'es' if count != 1 else ''} it started were ended"


PROC = Path("/proc")
WATCH_SECONDS = 0.2                 # how often a running command's descendants are looked up


def process_stat(pid) -> tuple | None:
    """(parent pid, start time) of a process, from /proc; None once it has ended."""
    try:
        # the name may hold ")"
        fields = Path(PROC, str(pid), "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def process_table() -> dict:
    """pid -> (parent pid, start time) of every process."""
    return {int(entry.name): stat for entry in os.scandir(PROC)
            if entry.name.isdigit() and (stat := process_stat(entry.name))}


def descendants(root: int) -> dict:
    """pid -> start time of every process below root, however far down."""
    children = {}
    for pid, (parent, started) in process_table().items():
        children.setdefault(parent, []).append((pid, started))
    found, below = {}, [root]
    while below:
        for pid, started in children.get(below.pop(), []):
            if pid not in found:
                found[pid] = started
                below.append(pid)
    return found


class ProcessTree:
    """A running command's processes. Its process group holds what it started, except a
    process that called setsid (a daemon, `setsid cmd &`); /proc finds those by their parents,
    looked up while the command runs too, in case the parent is gone by the time it ends."""

    def __init__(self, wrappers: int = 0):
        self.seen, self.done, self.watched = {}, threading.Event(), PROC.is_dir()
        # processes between the one started and the command's shell: not the command's
        self.wrappers = wrappers

    def start_watching(self, pid: int) -> None:
        if self.watched:
            threading.Thread(target=self.watch, args=(pid,), daemon=True).start()

    def watch(self, pid: int) -> None:
        while not self.done.wait(WATCH_SECONDS):
            # a new dict: end() may be reading the old one
            self.seen = {**self.seen, **descendants(pid)}

    def end(self, proc) -> int:
        """Kill the command (proc), every descendant still running and its group; how many
        processes besides the command were ended (-1: no /proc, only the group was)."""
        self.done.set()
        family = {**self.seen, **descendants(proc.pid)} if self.watched else {}
        # counted before any ends
        running = [process for process in family.items() if still_runs(process)]
        # the shell first: killed, it reports nothing about its children (bwrap: ends them all)
        proc.kill()
        for process in running:
            kill_if_same(process)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # and whatever the group started since
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        return max(len(running) - self.wrappers, 0) if self.watched else -1


def still_runs(process: tuple) -> bool:
    """Whether a process seen earlier still runs: its start time tells it from a new process
    given the same number since."""
    stat = process_stat(process[0])
    return stat is not None and stat[1] == process[1]


def kill_if_same(process: tuple) -> None:
    if still_runs(process):
        try:
            os.kill(process[0], signal.SIGKILL)
        except OSError:  # it ended meanwhile
            pass


class CapturedOutput:
    """A command's output as it arrives. Every byte goes to a file in the tool-results
    folder, secrets redacted on the way; only the head and the tail stay in memory, so
    100 MB of output costs what 220 KB does. The file is kept only when the output was
    too long to show whole."""

    def __init__(self, workdir: Path, folder: Path, secrets):
        # folder is relative to workdir until the first byte comes and own_folder checks it
        self.workdir, self.folder, self.file, self.unsaved = workdir, folder, None, None
        self.secrets = Redactor.of(secrets)
        self.overlap = max(self.secrets.reach - 1, 0)  # a secret may straddle two chunks
        self.carry, self.head, self.tail, self.total = b"", bytearray(), bytearray(), 0
        self.lock, self.done = threading.Lock(), False

    def drain(self, pipe) -> None:
        while chunk := pipe.read1(65536):
            with self.lock:
                if self.done:
                    return
                data = self.secrets.redact_bytes(self.carry + chunk)
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
                    self.folder = own_folder(self.workdir, self.folder)
                    self.file = tempfile.NamedTemporaryFile(dir=self.folder, prefix=".bash-",
                                                            suffix=".partial", delete=False)
                self.file.write(data)
            except OSError as err:
                # the head and tail are still shown; the note says the rest is lost
                self.unsaved = err

    def finish(self, tool_use_id: str | None) -> Path | None:
        """Stop reading; keep the file under the call's id if the output was cut, else remove
        it."""
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

    def as_result(self, saved: Path | None) -> str:
        head = self.head.decode("utf-8", "replace")
        if not self.tail:
            return head
        omitted = self.total - len(self.head) - len(self.tail)
        if saved:
            where = (f"the whole output is saved at {saved}; read_file (offset/limit) or grep it "
                     "for the part you need")
        else:
            where = "redirect the output to a file and read the part you need"
        note = f"[... {omitted:,} bytes of output omitted ({self.total:,} in all); {where} ...]"
        return f"{head}\n{note}\n" + self.tail.decode("utf-8", "replace")


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
