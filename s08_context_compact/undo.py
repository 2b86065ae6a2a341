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
MAX_TURNS = 20                      # turns that /undo can go back, one after another
STALE_SECONDS = 86_400              # a folder a run left behind (it was killed) is removed after a day


class Undo:
    """The records of the turns that changed files, and the copies they point at."""

    def __init__(self):
        self.workdir, self.warn, self.said = None, print, set()  # the workspace's, known from the first call
        self.undo, self.redo, self.cache = [], [], {}   # records (label, files); path -> (stat key, hash)
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
                self.undo = (self.undo + [(self.label, files)])[-MAX_TURNS:]
                self.redo = []

    def record(self) -> dict | None:
        """{path: (hash, mode) or ("link", target)} of the workspace now, each content kept."""
        files, in_git = {}, self.git_blobs()
        for path in self.walk():
            if path is None:
                return self.once("too many", f"[undo] the workspace has over {MAX_FILES:,} files: turns are not "
                                              "recorded, and /undo cannot put files back")
            relative = str(path.relative_to(self.workdir))
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    files[relative] = ("link", os.readlink(path))
                elif stat.S_ISREG(info.st_mode):
                    files[relative] = (self.keep(path, info, in_git.get(relative)), stat.S_IMODE(info.st_mode))
            except OSError:
                continue  # gone since it was listed, or unreadable: nothing to put back
        return files

    def git_blobs(self) -> dict:
        """In a git repository (the workspace its top): the tracked files and their blobs' ids
        in the index. A file whose content hashes to its blob is not copied (git keeps it).
        The repository is not trusted: git is asked nothing that would run a command its
        configuration names (no diff, no filter; core.fsmonitor off)."""
        git = ["git", "-c", "core.fsmonitor=false", "-C", str(self.workdir)]
        try:
            top = subprocess.run(git + ["rev-parse", "--show-toplevel"], capture_output=True, timeout=20)
            if top.returncode or Path(os.fsdecode(top.stdout.strip())).resolve() != self.workdir:
                return {}
            staged = subprocess.run(git + ["ls-files", "-s", "-z"], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        blobs = {}
        for entry in filter(None, os.fsdecode(staged.stdout).split("\0")) if not staged.returncode else []:
            meta, _, path = entry.partition("\t")
            mode, blob, stage = meta.split()
            if stage == "0" and mode in ("100644", "100755"):
                blobs[path] = blob
        return blobs

    def content(self, digest: str) -> bytes:
        if digest.startswith("git:"):
            return subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(self.workdir), "cat-file", "blob",
                                   digest[4:]], capture_output=True, timeout=60, check=True).stdout
        return (self.folder() / digest).read_bytes()

    def walk(self):
        count = 0
        for top, dirs, names in os.walk(self.workdir):
            dirs[:] = [d for d in dirs if d not in SKIPPED]
            for name in names:
                count += 1
                yield None if count > MAX_FILES else Path(top) / name
                if count > MAX_FILES:
                    return

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
                if time.time() - old.stat().st_mtime > STALE_SECONDS:
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
            kept = {entry[0] for _, files in self.undo + self.redo for entry in files.values()}
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

    def step(self, back: bool) -> str:
        """/undo (back) or /redo: put the workspace as the record says; what was done, in words."""
        records = self.undo if back else self.redo
        if not records:
            return ("Nothing to undo: no request of this session has changed files yet (or they were all undone)."
                    if back else "Nothing to redo: /redo puts back what the last /undo replaced.")
        label, target = records.pop()
        now = self.record()  # what is here now is kept first: nothing is lost, and /redo (or /undo) brings it back
        if now is None:
            records.append((label, target))
            return "The workspace is too big to record, so nothing was changed."
        (self.redo if back else self.undo).append((label, now))
        changed, removed = self.put(target, now)
        if not changed and not removed:
            return "The files were already as they were then: nothing to put back."
        verb = "before" if back else "after /undo of"
        where = f'as they were {verb} your request "{label[:60]}"' if label else "as they were"
        said = [f"{len(changed)} put back ({', '.join(changed[:6])}{', …' if len(changed) > 6 else ''})"] if changed else []
        said += [f"{len(removed)} taken away ({', '.join(removed[:6])}{', …' if len(removed) > 6 else ''})"] if removed else []
        return f"[{'undo' if back else 'redo'}] files {where}: {'; '.join(said)}. " + \
            ("/redo puts them back as they were." if back else "/undo goes back again.")

    def put(self, target: dict, now: dict) -> tuple:
        """Make the workspace hold target's files; (paths written, paths removed)."""
        changed = [path for path, entry in target.items() if now.get(path) != entry and entry[0] is not None]
        removed = [path for path in now if path not in target]
        for path in list(changed):
            try:
                self.write(self.workdir / path, target[path])
            except (OSError, subprocess.SubprocessError) as err:  # its copy gone (git gc, a disk error)
                changed.remove(path)
                self.warn(f"[undo] could not put back {path}: {err}")
        for path in removed:
            (self.workdir / path).unlink(missing_ok=True)
            self.cache.pop(str(self.workdir / path), None)
            self.prune(Path(path).parent, target)
        return sorted(changed), sorted(removed)

    def write(self, path: Path, entry: tuple) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():  # a folder where the file was: what it holds is recorded
            shutil.rmtree(path)
        if entry[0] == "link":
            path.unlink(missing_ok=True)
            os.symlink(entry[1], path)
            return
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, prefix=".undo-") as f:
            f.write(self.content(entry[0]))
        os.chmod(f.name, entry[1])
        os.replace(f.name, path)  # whole or not at all
        self.cache.pop(str(path), None)

    def prune(self, folder: Path, target: dict) -> None:
        """Remove folders the undone turn made that are empty now."""
        while str(folder) not in ("", ".") and not any(p.startswith(f"{folder}/") for p in target):
            try:
                (self.workdir / folder).rmdir()
            except OSError:
                return
            folder = folder.parent


def undo_hooks(agent) -> dict:
    """The record taken before a turn's first change, as hooks beside the ledger's."""
    def on_prompt(event: dict):
        agent.undo.new_turn(event["prompt"])

    def before_tool(event: dict):
        agent.undo.at(agent.workdir, agent.say).before_change(event["name"])
    return {"UserPromptSubmit": on_prompt, "PreToolUse": before_tool}
