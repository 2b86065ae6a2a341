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
a day later, if it could not). Each copy is named by the sha256 of its content and kept
once: a file unchanged from one turn to the next costs nothing more. Where the filesystem
offers reflinks (btrfs, XFS), a copy shares the file's blocks instead of duplicating them.
Bounded: a file over MAX_FILE_BYTES is not kept, a workspace of over MAX_FILES files is
not recorded, and the copies stay under MAX_STORE_BYTES, the oldest turns dropped first;
each is said once. Never recorded: .git, the program's own folders, and folders a tool
rebuilds (SKIPPED).

Undo runs no other program, git included: a repository's configuration is the
repository's to write (a turn can name a command in it for git to run), so a file is
never read back from git, only from undo's own copy. A turn that deletes .git loses no
file undo kept.

A file whose size, times (ctime included: any write sets it, nothing sets it back) and
inode are as at its last reading is not read again, which keeps a record fast. Before
/undo or /redo overwrites or removes a path, though, what is there is read again and
compared by content: a person's edit of the same size, its mtime put back (cp -p,
touch -r, rsync -t), is left as it is.

Machinery the chapter does not need: code.py installs undo_hooks beside the ledger's,
and user_turns.py runs /undo and /redo.
"""

import atexit
import hashlib
import itertools
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from ..basics import OWN_FOLDERS, undo_folder

try:
    import fcntl  # a reflink is asked for with an ioctl
except ImportError:  # Windows: plain copies
    fcntl = None

CHANGES_FILES = ("write_file", "edit_file", "bash", "task")
SKIPPED = {".git", *OWN_FOLDERS, "node_modules", ".venv", "venv", "__pycache__",
           ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".hypothesis"}
MAX_FILE_BYTES = 20_000_000
MAX_FILES = 50_000
MAX_STORE_BYTES = 500_000_000
SAY_RECORDING = 5_000       # a first record of more files than this says so before it starts
MAX_TURNS = 20              # turns that /undo can go back, one after another
STALE_SECONDS = 86_400      # a folder a run left behind (it was killed) is removed after a day
CHUNK = 1 << 20             # a file is read, hashed and copied a megabyte at a time
# Linux's request for a reflink, a copy that shares the file's blocks (Python names it from 3.12)
FICLONE = getattr(fcntl, "FICLONE", 0x40049409)  # (on Linux; never asked elsewhere)
# A file's times tick coarsely (a few ms on ext4, 2 s on FAT): a file changed this close to
# being read could change again, same size, within the same tick. Its stat key is not
# trusted, so the next record reads it again.
RACY_NS = 2 * 10**9


class Undo:
    """The records of the turns that changed files, and the copies they point at."""

    def __init__(self):
        self.workdir, self.warn = None, print  # the workspace's, known from the first call
        self.said = set()
        self.undo, self.redo = [], []  # records: (label, before, after)
        self.cache = {}  # path -> (stat key, hash); key None: it may not stand for the hash
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

    def record(self, fresh: frozenset = frozenset()) -> dict | None:
        """{path: (hash, mode) or ("link", target)} of the workspace now, each content kept.
        The paths in fresh are read again whatever their stat says: /undo is about to
        overwrite or remove them, and decides that by their content alone."""
        paths = list(itertools.islice(self.walk(), MAX_FILES + 1))
        if len(paths) > MAX_FILES:
            return self.once("too many", f"[undo] the workspace has over {MAX_FILES:,} files: "
                                          "turns are not recorded, and /undo cannot put files back")
        if len(paths) > SAY_RECORDING and not self.cache:  # the first record reads them all: say so
            self.warn(f"[undo] recording the workspace's {len(paths):,} files before the first "
                      "change, so /undo can put them back…")
        files = {}
        for path in paths:
            relative = str(path.relative_to(self.workdir))
            entry = self.entry(path, relative in fresh)
            if entry is not None:
                files[relative] = entry
        return files

    def entry(self, path: Path, fresh: bool) -> tuple | None:
        """A path's entry in a record: ("link", target); (hash, mode) for a file, (None, mode)
        when it is there but not kept; None when it is gone, or neither."""
        try:
            info = os.lstat(path)
        except OSError:
            return None  # gone since it was listed
        try:
            if stat.S_ISLNK(info.st_mode):
                return ("link", os.readlink(path))
            if stat.S_ISREG(info.st_mode):
                return (self.keep(path, info, fresh), stat.S_IMODE(info.st_mode))
        except FileNotFoundError:
            return None  # gone since it was listed
        except PermissionError:  # there, but not kept: /undo leaves it as it is, never removes it
            return (None, stat.S_IMODE(info.st_mode))
        except OSError as err:  # a full disk, an I/O error: there all the same, so never taken for absent
            self.once(f"not kept {path}", f"[undo] {path.relative_to(self.workdir)} could not be kept "
                                          f"({err.strerror or err}): /undo will leave it as it is")
            return (None, stat.S_IMODE(info.st_mode))
        return None

    def walk(self):
        for top, dirs, names in os.walk(self.workdir):
            links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
            names += links  # a link to a folder is a link, never walked into
            dirs[:] = [d for d in dirs if d not in SKIPPED and d not in links]
            yield from (Path(top) / name for name in names)

    def keep(self, path: Path, info, fresh: bool = False) -> str | None:
        """The content's hash, its copy kept once; None when it is too big to keep. A file
        whose stat key is the one cached is not read again, unless fresh."""
        cached = self.cache.get(str(path))
        if cached and cached[0] == stat_key(info) and not fresh:
            return cached[1]
        if info.st_size <= MAX_FILE_BYTES:
            digest, key = self.copy_in(path)
            if digest is not None:
                self.cache[str(path)] = (key, digest)
                return digest
        self.once(str(path), f"[undo] {path.relative_to(self.workdir)} is over "
                             f"{MAX_FILE_BYTES // 10**6} MB: not kept, so /undo cannot put it back")
        return None

    def copy_in(self, path: Path) -> tuple:
        """(the hash of the file at path, its copy kept, or None past MAX_FILE_BYTES; the stat
        key that may stand for this content next time, or None)."""
        # O_NOFOLLOW: never through a link put there since the lstat; O_NONBLOCK: nor wait on a FIFO
        source = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            read_at = time.time_ns()
            info = os.fstat(source)  # before the read: a write during it moves ctime past this key
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{path} is no longer a file")
            return self.store_copy(source), trusted_key(info, read_at)
        finally:
            os.close(source)

    def store_copy(self, source: int) -> str | None:
        """The open file source copied into the store, named by its hash; None (nothing kept)
        past MAX_FILE_BYTES. Written aside, then renamed: a copy is whole or absent."""
        descriptor, part = tempfile.mkstemp(dir=self.folder(), prefix=".part-")
        try:
            with os.fdopen(descriptor, "wb") as copy:
                digest, size = copy_hashing(source, copy, MAX_FILE_BYTES)
            if digest is None or (self.folder() / digest).exists():
                return digest  # kept already: this turn's or an earlier one's
            self.room_for(size)
            os.replace(part, self.folder() / digest)
            self.stored += size
            return digest
        finally:
            Path(part).unlink(missing_ok=True)

    def folder(self) -> Path:
        """This run's folder of copies (made, readable by you only, with the first copy)."""
        if self.store is None:
            base = undo_folder()
            base.mkdir(parents=True, exist_ok=True, mode=0o700)
            for old in base.iterdir():  # a run that was killed left its copies: a day later they go
                stale = time.time() - old.stat().st_mtime > STALE_SECONDS
                if stale and not running(old.name.split("-")[0]):
                    shutil.rmtree(old, ignore_errors=True)
            self.store = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))
            atexit.register(shutil.rmtree, self.store, True)
        return self.store

    def room_for(self, size: int) -> None:
        """Drop the oldest turns' records (and copies only they held) until size fits."""
        while self.stored + size > MAX_STORE_BYTES and self.undo:
            self.undo.pop(0)
            self.once("room", f"[undo] its copies passed {MAX_STORE_BYTES // 10**6} MB: the oldest "
                              "turns can no longer be undone")
            kept = {entry[0] for record in self.undo + self.redo for files in record[1:] if files
                    for entry in files.values()}
            kept |= {digest for _, digest in self.cache.values()}
            for copy in self.folder().iterdir():
                # a name with a dot first is a copy still being written
                if copy.name not in kept and not copy.name.startswith(".") and copy.is_file():
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
        if not records and back:
            return ("Nothing to undo: no request since the program started has changed files "
                    "(or all were undone).")
        if not records:
            return "Nothing to redo: /redo puts back what the last /undo replaced."
        label, before, after = records.pop()
        ended = self.record() if after is None else after  # a turn cut short left what is here now
        # What is here now is kept first, so nothing is lost; each path about to change is read
        # again, so what decides "changed since" is its content, never its size and times.
        present = None if ended is None else self.record(fresh=frozenset(changed(before, ended)))
        if present is None:
            records.append((label, before, after))
            return "The workspace is too big to record, so nothing was changed."
        done, kept = self.apply(ended, before, present) if back else self.apply(before, ended, present)
        (self.redo if back else self.undo).append((label, before, ended))
        return told(back, label, done, kept)

    def apply(self, source: dict, target: dict, present: dict) -> tuple:
        """Each path that differs between the records goes from source's state to target's,
        where it is still as source has it. Removals first (deepest first), then writes
        (shallowest first), so a link or a file in the way of a folder goes before the folder
        is made; nothing is ever written or removed through a link. (paths done, paths left)."""
        def order(path: str) -> tuple:
            removed = target.get(path) is None
            return (not removed, -path.count("/") if removed else path.count("/"))
        done, kept = [], []
        for path in sorted(sorted(changed(source, target)), key=order):
            if not movable(path, source, target, present):
                kept.append(path)  # changed since, or a copy that was never kept: left as it is
                continue
            try:
                if target.get(path) is None:
                    self.remove(path, target)
                else:
                    self.write(path, target[path])
                done.append(path)
            except OSError as err:  # its copy gone, a disk error, a link where a folder was
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
                where = folder.relative_to(self.workdir)
                raise OSError(f"{where} is a link or a file now, not a folder")
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
            where.rmdir()  # a folder where the file was: empty by now, else this fails, it stays
        if entry[0] == "link":
            where.unlink(missing_ok=True)
            os.symlink(entry[1], where)
            return
        descriptor, part = tempfile.mkstemp(dir=where.parent, prefix=".undo-")
        try:
            with os.fdopen(descriptor, "wb") as out, open(self.folder() / entry[0], "rb") as copy:
                if not clone(copy.fileno(), out.fileno()):
                    shutil.copyfileobj(copy, out, CHUNK)
            os.chmod(part, entry[1])
            os.replace(part, where)  # whole or not at all; a link there is replaced, not followed
        finally:
            Path(part).unlink(missing_ok=True)
        self.cache.pop(str(where), None)


def stat_key(info) -> tuple:
    """What changes whenever a file's content may have. Any write sets ctime, and nothing
    sets it back: touch -r, cp -p and rsync -t put back the mtime only."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def trusted_key(info, read_at: int) -> tuple | None:
    """The stat key that may stand for content read at read_at; None for a file changed
    within RACY_NS before it (it could change again and keep this key)."""
    if max(info.st_mtime_ns, info.st_ctime_ns) > read_at - RACY_NS:
        return None
    return stat_key(info)


def clone(source: int, target: int) -> bool:
    """Make the open file target share source's blocks (a reflink); False where the
    filesystem does not offer it (ext4, tmpfs) or the two are on different ones."""
    if fcntl is None or not sys.platform.startswith("linux"):
        return False
    try:
        fcntl.ioctl(target, FICLONE, source)
    except OSError:
        return False
    return True


def copy_hashing(source: int, copy, limit: int) -> tuple:
    """Copy the open file source into the file object copy, hashed in the same read:
    (sha256 hex digest, size), or (None, size) past limit bytes. A reflink, where offered,
    is made first and read instead: either way the hash is of the copy's own bytes."""
    cloned = clone(source, copy.fileno())
    reading = copy.fileno() if cloned else source
    digest, size = hashlib.sha256(), 0
    while chunk := os.pread(reading, CHUNK, size):
        size += len(chunk)
        if size > limit:
            return None, size
        digest.update(chunk)
        if not cloned:
            copy.write(chunk)
    return digest.hexdigest(), size


def changed(first: dict, second: dict) -> set:
    """The paths whose entries differ between two records."""
    return {path for path in first.keys() | second.keys() if first.get(path) != second.get(path)}


def movable(path: str, source: dict, target: dict, present: dict) -> bool:
    """Whether /undo (or /redo) may change path: it is still as source has it, by content,
    and what is there and what would replace it are both kept. A file not kept (too big,
    unreadable) is never overwritten or removed: its content cannot be compared, and /redo
    could not put it back."""
    here, going = present.get(path), target.get(path)
    if here != source.get(path):
        return False  # changed since the record
    if here is not None and here[0] is None:
        return False
    return going is None or going[0] is not None


def told(back: bool, label: str, done: list, kept: list) -> str:
    """The line /undo or /redo prints: what was put back, what was left and why."""
    said = []
    if done:
        said.append(f"{len(done)} put back as they were ({listed(done)})")
    if kept:
        said.append(f"{len(kept)} left as they are: changed since, or not kept ({listed(kept)})")
    opening = "[undo] files your request" if back else "[redo] files the /undo of your request"
    ending = ". /redo reverses this." if back and done else "."
    return f"{opening} \"{label[:60]}\" changed: " + ("; ".join(said) or "none") + ending


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


def undo_hooks(current) -> dict:
    """The record taken before a turn's first change, as hooks beside the ledger's. current() gives
    what they read, as it is when they run: (the Undo, the workdir, say, the main agent's history)."""
    def on_prompt(event: dict):
        current()[0].new_turn(event["prompt"])

    def before_tool(event: dict):
        undo, workdir, say, _ = current()
        undo.at(workdir, say).before_change(event["name"])

    def after_turn(event: dict):
        undo, _, _, history = current()
        if event["messages"] is history:  # the main agent's turn, not a subagent's
            undo.end_turn()
    return {"UserPromptSubmit": on_prompt, "PreToolUse": before_tool, "Stop": after_turn}
