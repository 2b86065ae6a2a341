"""Undo of a turn. Before the first tool call of a turn that may change the workspace
(write_file, edit_file, bash, a subagent's included), its files are recorded: each
path with a hash of its content, each content kept once. /undo compares the workspace
with that record and puts back every file the turn changed or deleted, and takes away
the ones it created; what it replaced is recorded first, so /redo puts that back.

A text check of commands always misses some form; this makes the loss of a file cost
nothing whatever form deleted it, within the session.

The copies are your files verbatim (a .env's keys included: they must come back as they
were), so they live outside the workspace, readable by you only: $XDG_STATE_HOME/s08/undo/
(else ~/.local/state/s08/undo/), one folder a run, removed when the program ends (and
a day later, if it could not). Bounded: a file over MAX_FILE_BYTES is not kept, a
workspace of over MAX_FILES files is not recorded, and the copies stay under
MAX_STORE_BYTES, the oldest turns dropped first; each is said once. Never recorded: .git
(its history is git's to keep), the program's own folders, and folders a tool rebuilds
(SKIPPED). In a git repository, a tracked file whose content is the index's is not copied:
git already keeps that content, and /undo reads it back from there.

Machinery the chapter does not need: code.py installs undo_hooks beside the ledger's,
and turns.py runs /undo and /redo.
"""

import atexit
import hashlib
import itertools
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from log_checks import key_file

CHANGES_FILES = ("write_file", "edit_file", "bash", "task")
SKIPPED = {".git", ".transcripts", ".task_outputs", "node_modules", ".venv", "venv", "__pycache__", ".pytest_cache",
           ".mypy_cache", ".ruff_cache", ".tox", ".hypothesis"}
MAX_FILE_BYTES = 20_000_000
MAX_FILES = 50_000
MAX_STORE_BYTES = 500_000_000
SAY_RECORDING = 5_000               # a first record of more files than this says so before it starts
MAX_TURNS = 20                      # turns that /undo can go back, one after another
STALE_SECONDS = 86_400              # a folder a run left behind (it was killed) is removed after a day


class Undo:
    """The records of the turns that changed files, and the copies they point at."""

    def __init__(self):
        self.workdir, self.warn, self.said = None, print, set()  # the workspace's, known from the first call
        self.undo, self.redo, self.cache = [], [], {}   # (label, before, after) records; path -> (stat key, hash)
        self.store, self.stored, self.turn_recorded, self.label = None, 0, True, ""

    # ---- recording ----

    def new_turn(self, prompt: str) -> None:
        self.turn_recorded, self.label = False, prompt

    def at(self, workdir: Path, warn) -> "Undo":
        self.workdir, self.warn = workdir.resolve(), warn
        return self

    def before_change(self, tool: str) -> None:
        """Record the workspace before the turn's first tool call that may change it."""
        if tool in CHANGES_FILES and not self.turn_recorded:
            self.turn_recorded = True
            files = self.record()
            if files is not None:
                self.undo = (self.undo + [(self.label, files, None)])[-MAX_TURNS:]
                self.redo = []

    def record(self) -> dict | None:
        """{path: (hash, mode) or ("link", target)} of the workspace now, each content kept."""
        paths = list(itertools.islice(self.walk(), MAX_FILES + 1))
        if len(paths) > MAX_FILES:
            return self.once("too many", f"[undo] the workspace has over {MAX_FILES:,} files: turns are not "
                                          "recorded, and /undo cannot put files back")
        if len(paths) > SAY_RECORDING and not self.cache:  # the first record reads them all: say why it waits
            self.warn(f"[undo] recording the workspace's {len(paths):,} files before the first change, so /undo "
                      "can put them back…")
        files, in_git = {}, self.git_blobs()
        for path in paths:
            relative = str(path.relative_to(self.workdir))
            try:
                info = os.lstat(path)
            except OSError:
                continue  # gone since it was listed
            try:
                if stat.S_ISLNK(info.st_mode):
                    files[relative] = ("link", os.readlink(path))
                elif stat.S_ISREG(info.st_mode):
                    files[relative] = (self.keep(path, info, in_git.get(relative)), stat.S_IMODE(info.st_mode))
            except PermissionError:  # there, but not kept: /undo leaves it as it is, never removes it
                files[relative] = (None, stat.S_IMODE(info.st_mode))
            except OSError:
                continue
        return files

    def git_blobs(self) -> dict:
        """In a git repository (the workspace its top): the tracked files and their blobs' ids
        in the index. A file whose content hashes to its blob is not copied (git keeps it).
        The repository is not trusted: git is asked nothing that would run a command its
        configuration names (no diff, no filter; core.fsmonitor off)."""
        try:
            top = self.git("rev-parse", "--show-toplevel")
            if top.returncode or Path(os.fsdecode(top.stdout.strip())).resolve() != self.workdir:
                return {}
            staged = self.git("ls-files", "-s", "-z")
        except (OSError, subprocess.TimeoutExpired):
            return {}
        blobs = {}
        for entry in filter(None, os.fsdecode(staged.stdout).split("\0")) if not staged.returncode else []:
            meta, _, path = entry.partition("\t")
            mode, blob, stage = meta.split()
            if stage == "0" and mode in ("100644", "100755"):
                blobs[path] = blob
        return blobs

    def git(self, *args: str, check: bool = False):
        """git in the workspace, told not to run the command a repository may name for core.fsmonitor."""
        return subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(self.workdir), *args],
                              capture_output=True, timeout=60, check=check)

    def content(self, digest: str) -> bytes:
        if digest.startswith("git:"):
            return self.git("cat-file", "blob", digest[4:], check=True).stdout
        return (self.folder() / digest).read_bytes()

    def walk(self):
        for top, dirs, names in os.walk(self.workdir):
            names += [d for d in dirs if os.path.islink(os.path.join(top, d))]  # a link to a folder is a link
            dirs[:] = [d for d in dirs if d not in SKIPPED and not os.path.islink(os.path.join(top, d))]
            yield from (Path(top) / name for name in names)

    def keep(self, path: Path, info, blob: str | None = None) -> str | None:
        """The content's hash, its copy kept once; "git:<blob>" when git holds it already;
        None when it is too big to keep."""
        key = (info.st_size, info.st_mtime_ns, info.st_ino)
        if self.cache.get(str(path), (None,))[0] == key:
            return self.cache[str(path)][1]
        if info.st_size > MAX_FILE_BYTES:
            self.once(str(path), f"[undo] {path.relative_to(self.workdir)} is over {MAX_FILE_BYTES // 10**6} MB: "
                                 "not kept, so /undo cannot put it back")
            return None
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if blob and hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob:
            self.cache[str(path)] = (key, f"git:{blob}")
            return f"git:{blob}"
        digest = hashlib.sha256(data).hexdigest()
        copy = self.folder() / digest
        if not copy.exists():
            self.room_for(len(data))
            with tempfile.NamedTemporaryFile(dir=copy.parent, delete=False) as f:
                f.write(data)
            os.replace(f.name, copy)
            self.stored += len(data)
        self.cache[str(path)] = (key, digest)
        return digest

    def folder(self) -> Path:
        """This run's folder of copies (made, readable by you only, with the first copy)."""
        if self.store is None:
            base = key_file().parent / "undo"
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            for old in base.iterdir():  # a run that was killed left its copies: a day later they go
                if time.time() - old.stat().st_mtime > STALE_SECONDS and not running(old.name.split("-")[0]):
                    shutil.rmtree(old, ignore_errors=True)
            self.store = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))
            atexit.register(shutil.rmtree, self.store, True)
        return self.store

    def room_for(self, size: int) -> None:
        """Drop the oldest turns' records (and copies only they held) until size fits."""
        while self.stored + size > MAX_STORE_BYTES and self.undo:
            self.undo.pop(0)
            self.once("room", f"[undo] its copies passed {MAX_STORE_BYTES // 10**6} MB: the oldest turns can no "
                              "longer be undone")
            kept = {entry[0] for record in self.undo + self.redo for files in record[1:] if files
                    for entry in files.values()}
            kept |= {digest for _, digest in self.cache.values()}
            for copy in self.folder().iterdir():
                if copy.name not in kept and copy.is_file():
                    self.stored -= copy.stat().st_size
                    copy.unlink()
        if self.stored + size > MAX_STORE_BYTES:
            self.cache.clear()

    def once(self, what: str, line: str) -> None:
        if what not in self.said:
            self.said.add(what)
            self.warn(line)

    # ---- putting back ----

    def end_turn(self) -> None:
        """The turn is over: what it left is recorded, so /undo touches only what it changed
        (and leaves what anyone changed since). A turn that changed nothing is forgotten."""
        if self.undo and self.undo[-1][2] is None:
            label, before, _ = self.undo.pop()
            after = self.record()
            if after is not None and after != before:
                self.undo.append((label, before, after))

    def step(self, back: bool) -> str:
        """/undo (back) or /redo: what the last recorded turn changed goes back to how it was
        before it (or, for /redo, after it); what has changed since is left as it is."""
        records = self.undo if back else self.redo
        if not records:
            return ("Nothing to undo: no request since the program started has changed files (or all were undone)."
                    if back else "Nothing to redo: /redo puts back what the last /undo replaced.")
        label, before, after = records.pop()
        now = self.record()  # what is here now is kept first: nothing is lost
        if now is None:
            records.append((label, before, after))
            return "The workspace is too big to record, so nothing was changed."
        after = after if after is not None else now
        done, kept = self.apply(after, before, now) if back else self.apply(before, after, now)
        (self.redo if back else self.undo).append((label, before, after))
        said = [f"{len(done)} put back as they were ({listed(done)})"] if done else []
        said += [f"{len(kept)} left as they are: changed since, or not kept ({listed(kept)})"] if kept else []
        verb = "your request" if back else "the /undo of your request"
        return f"[{'undo' if back else 'redo'}] files {verb} \"{label[:60]}\" changed: " + \
            ("; ".join(said) or "none") + (". /redo reverses this." if back and done else ".")

    def apply(self, source: dict, target: dict, now: dict) -> tuple:
        """Each path that differs between the records goes from source's state to target's,
        where it is still as source has it. Removals first (deepest first), then writes
        (shallowest first), so a link or a file in the way of a folder goes before the folder
        is made; nothing is ever written or removed through a link. (paths done, paths left)."""
        paths = sorted({p for p in source.keys() | target.keys() if source.get(p) != target.get(p)})
        done, kept = [], []
        for path in sorted(paths, key=lambda p: (target.get(p) is not None, -p.count("/") if target.get(p) is None
                                                  else p.count("/"))):
            entry = target.get(path)
            if now.get(path) != source.get(path) or entry is not None and entry[0] is None or \
                    entry is None and now.get(path, (None,))[0] is None and path in now:
                kept.append(path)  # changed since, or a copy that was never kept: left as it is
                continue
            try:
                self.remove(path, target) if entry is None else self.write(path, entry)
                done.append(path)
            except (OSError, subprocess.SubprocessError) as err:  # its copy gone (git gc), a disk error
                kept.append(path)
                self.warn(f"[undo] could not put back {path}: {err}")
        return done, kept

    def real_folder(self, relative: Path, make: bool = True) -> Path:
        """The workspace folder a relative path names (made if missing, when make); OSError if
        any part of it is a link or a file: nothing goes through a link, out of the workspace."""
        folder = self.workdir
        for part in relative.parts:
            folder = folder / part
            if folder.is_symlink() or folder.exists() and not folder.is_dir():
                raise OSError(f"{folder.relative_to(self.workdir)} is a link or a file now, not a folder")
            if make:
                folder.mkdir(exist_ok=True)
        return folder

    def remove(self, path: str, target: dict) -> None:
        where = self.real_folder(Path(path).parent, make=False) / Path(path).name
        if where.is_dir() and not where.is_symlink():
            where.rmdir()  # only empty: what is inside was recorded and removed first, or is left
        else:
            where.unlink(missing_ok=True)  # a link itself, never what it points to
        self.cache.pop(str(where), None)
        folder = Path(path).parent
        while str(folder) not in ("", ".") and not any(p.startswith(f"{folder}/") for p in target):
            try:  # folders the turn made, empty now
                (self.workdir / folder).rmdir()
            except OSError:
                break
            folder = folder.parent

    def write(self, path: str, entry: tuple) -> None:
        where = self.real_folder(Path(path).parent) / Path(path).name
        if where.is_dir() and not where.is_symlink():
            where.rmdir()  # a folder where the file was: empty by now, else this fails and it is left
        if entry[0] == "link":
            where.unlink(missing_ok=True)
            os.symlink(entry[1], where)
            return
        with tempfile.NamedTemporaryFile(dir=where.parent, delete=False, prefix=".undo-") as f:
            f.write(self.content(entry[0]))
        os.chmod(f.name, entry[1])
        os.replace(f.name, where)  # whole or not at all; a link there is replaced, not followed
        self.cache.pop(str(where), None)


def listed(paths: list) -> str:
    return ", ".join(paths[:6]) + (", …" if len(paths) > 6 else "")


def running(pid: str) -> bool:
    """Whether a program with this process id still runs (its copies are still wanted)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def undo_hooks(agent) -> dict:
    """The record taken before a turn's first change, as hooks beside the ledger's."""
    def on_prompt(event: dict):
        agent.undo.new_turn(event["prompt"])

    def before_tool(event: dict):
        agent.undo.at(agent.workdir, agent.say).before_change(event["name"])

    def after_turn(event: dict):
        if event["messages"] is agent.state.history:  # the main agent's turn, not a subagent's
            agent.undo.end_turn()
    return {"UserPromptSubmit": on_prompt, "PreToolUse": before_tool, "Stop": after_turn}
