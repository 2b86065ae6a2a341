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
from typing import NamedTuple

from ..basics import FOLDER, OWN_FOLDERS, undo_folder, walk_tree

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
# A path's entry when what is there could not be seen: a folder that could not be listed, a
# path under one. Like a file not kept, it is never overwritten or removed, nor is what it holds.
UNSEEN = (None, "unseen")


class StoreError(OSError):
    """The store could not take a copy (full, gone, not writable): the file is not to blame."""


class Turn(NamedTuple):
    """One turn's records: the workspace before its first change, and as the turn left it."""
    label: str
    before: dict
    after: dict | None = None  # None until the turn ends (or if recording its end was cut short)
    caveat: str = ""  # what /undo cannot put back because of how after was recorded; "" if nothing


class Undo:
    """The records of the turns that changed files, and the copies they point at."""

    def __init__(self, max_files: int = MAX_FILES):
        self.workdir, self.warn = None, print  # the workspace's, known from the first call
        self.max_files = max_files  # a workspace of more files than this is not recorded
        self.said = set()
        self.undo, self.redo = [], []  # Turns
        self.cache = {}  # path -> (stat key, hash); key None: it may not stand for the hash
        self.store, self.stored, self.turn_recorded, self.label = None, 0, True, ""
        self.not_recorded = ""  # why the latest request that could not be recorded was not, named

    # ---- recording ----

    def new_turn(self, prompt: str) -> None:
        self.turn_recorded, self.label = False, prompt

    def at(self, workdir: Path, warn) -> "Undo":
        self.workdir, self.warn = workdir.resolve(), warn
        return self

    def before_change(self, tool: str) -> None:
        """Record the workspace before the turn's first tool call that may change it."""
        if tool not in CHANGES_FILES or self.turn_recorded:
            return
        self.turn_recorded = True
        problem = self.store_problem()
        if problem:
            self.not_recorded = f"request \"{self.label[:60]}\" could not be recorded (no copy can be kept)"
            return self.once("store", problem)
        files = self.record()
        if files is None:
            self.not_recorded = (f"request \"{self.label[:60]}\" could not be recorded (the workspace has "
                                 f"over {self.max_files:,} files)")
            return self.once("too many", f"[undo] the workspace has over {self.max_files:,} files: "
                                          "turns are not recorded, and /undo cannot put files back")
        self.undo = (self.undo + [Turn(self.label, files)])[-MAX_TURNS:]
        self.redo = []

    def check_store(self) -> None:
        """Said at start if no copy can be kept, before a request could lose a file."""
        problem = self.store_problem()
        if problem:
            self.once("store", problem)

    def store_problem(self) -> str | None:
        """Why no copy can be kept (the store's folder cannot be made), with what fixes it;
        None when it can."""
        try:
            self.folder()
        except OSError as err:
            where = undo_folder()
            return (f"[undo] cannot keep copies of your files in {where} ({err.strerror or err}): "
                    "/undo will not be able to put back what a request changes. Make that folder "
                    "yours and writable, or set XDG_STATE_HOME to a folder that is.")
        return None

    def record(self) -> dict | None:
        """{path: (hash, mode) or ("link", target)} of the workspace now, each content kept;
        None when it holds over max_files files."""
        listed = list(itertools.islice(self.walk(), self.max_files + 1))
        if len(listed) > self.max_files:
            return None
        if len(listed) > SAY_RECORDING and not self.cache:  # the first record reads them all: say so
            self.warn(f"[undo] recording the workspace's {len(listed):,} files before the first "
                      "change, so /undo can put them back…")
        cut = len(str(self.workdir)) + 1
        files = {}
        for path, seen in listed:
            entry = self.entry(Path(path), False) if seen else UNSEEN
            if entry is not None:
                files[path[cut:]] = entry
        return files

    def record_paths(self, paths, fresh: bool = False) -> dict:
        """The record of these paths (relative) alone, each content kept; fresh: each read again
        whatever its stat says (/undo is about to overwrite or remove it, and decides that by
        its content alone)."""
        files = {}
        for relative in paths:
            if self.through_link(relative):
                continue  # not there, as a walk sees it: a walk never goes through a link
            entry = self.entry(self.workdir / relative, fresh)
            if entry is not None:
                files[relative] = entry
        return files

    def through_link(self, relative: str) -> bool:
        """Whether a folder on the way to a relative path is a link."""
        folder = self.workdir
        for part in Path(relative).parent.parts:
            folder = folder / part
            if os.path.islink(folder):
                return True
        return False

    def entry(self, path: Path, fresh: bool) -> tuple | None:
        """A path's entry in a record: ("link", target); (hash, mode) for a file, (None, mode)
        when it is there but not kept, UNSEEN when it cannot be looked at; None when it is
        gone, or neither."""
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone since it was listed
        except OSError:  # a folder on its way that cannot be entered: unknown, so never touched
            return UNSEEN
        try:
            if stat.S_ISLNK(info.st_mode):
                return ("link", os.readlink(path))
            if stat.S_ISREG(info.st_mode):
                return (self.keep(path, info, fresh), stat.S_IMODE(info.st_mode))
        except StoreError as err:  # the store full or gone: the file is there all the same
            self.once(f"not kept {path}", f"[undo] {path.relative_to(self.workdir)} could not be kept "
                                          f"({err}): /undo will leave it as it is")
            return (None, stat.S_IMODE(info.st_mode))
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
        """(path, seen) for each path the workspace holds that is not a folder (a link to one is
        a link, never walked into), and (folder, False) for a folder that could not be listed:
        what it holds is unknown, said once."""
        for path, what in walk_tree(str(self.workdir), skip=SKIPPED):
            if isinstance(what, OSError):
                where = os.path.relpath(path, self.workdir)
                self.once(f"unlisted {where}", f"[undo] {where}/ could not be listed ({what.strerror or what}):"
                                               " its files are not recorded, and /undo will leave them as they are")
                yield path, False
            elif what != FOLDER:
                yield path, True

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
        past MAX_FILE_BYTES. Written aside, then renamed: a copy is whole or absent. The store's
        own failures come as StoreError, never taken for the file's."""
        try:
            return self.copy_to_store(source)
        except OSError as err:
            raise StoreError(err.strerror or str(err)) from err

    def copy_to_store(self, source: int) -> str | None:
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
            kept = {entry[0] for turn in self.undo + self.redo for files in (turn.before, turn.after) if files
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
        """The turn is over, however it ended (an answer, an error, Ctrl-C, the step limit): what
        it left is recorded, so /undo touches only what it changed (and leaves what anyone changed
        since). A turn that changed nothing is forgotten. The record before it is never dropped:
        past max_files files, the end is recorded at the paths the turn started with."""
        if not self.undo or self.undo[-1].after is not None:
            return
        turn = self.undo[-1]
        after, caveat = self.record(), ""
        if after is None:
            after, caveat = self.record_paths(turn.before), self.too_many()
            self.warn(f"[undo] the workspace has over {self.max_files:,} files now: /undo can put back "
                      "what this request changed or deleted, but not take away the files it created")
        if after == turn.before and not caveat:
            self.undo.pop()
        else:
            self.undo[-1] = turn._replace(after=after, caveat=caveat)

    def step(self, back: bool) -> str:
        """/undo (back) or /redo: what the last recorded turn changed goes back to how it was
        before it (or, for /redo, after it); what has changed since is left as it is. One that
        changes nothing leaves both stacks as they were."""
        records = self.undo if back else self.redo
        if not records and back and self.not_recorded:
            return f"Nothing to undo: your {self.not_recorded}, so /undo cannot put back what it changed."
        if not records and back:
            return ("Nothing to undo: no request since the program started has changed files "
                    "(or all were undone).")
        if not records:
            return "Nothing to redo: /redo puts back what the last /undo replaced."
        turn = records[-1]
        ended = turn if turn.after is not None else self.ended_now(turn)
        source, target = (ended.after, turn.before) if back else (turn.before, ended.after)
        # Each path about to change is read again, so what decides "changed since" is its
        # content, never its size and times; what is there is kept first, so nothing is lost.
        present = self.record_paths(changed(source, target), fresh=True)
        done, kept = self.apply(source, target, present)
        if not done:
            return told(back, ended, done, kept)
        records.pop()
        (self.redo if back else self.undo).append(ended)
        return told(back, ended, done, kept)

    def ended_now(self, turn: Turn) -> Turn:
        """A turn whose end was never recorded (recording it was cut short): the workspace now
        stands for its end, and what /undo says names that."""
        now = self.record()
        if now is None:
            return turn._replace(after=self.record_paths(turn.before), caveat=self.too_many())
        return turn._replace(after=now, caveat="its end was not recorded, so what changed since counts as its own")

    def too_many(self) -> str:
        return (f"the files it created are left: at its end the workspace had over {self.max_files:,} files, "
                "too many to record")

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
    if any(in_unseen(path, record) for record in (source, target, present)):
        return False  # a folder on its way could not be listed: what it holds is unknown
    return going is None or going[0] is not None


def in_unseen(path: str, record: dict) -> bool:
    """Whether a folder that holds path is UNSEEN in the record."""
    parts = path.split("/")
    return any(record.get("/".join(parts[:n])) == UNSEEN for n in range(1, len(parts)))


def told(back: bool, turn: Turn, done: list, kept: list) -> str:
    """The line /undo or /redo prints: what was put back, what was left and why. It opens
    with "[" only when files changed (user_turns.py tells the model then)."""
    said = []
    if done:
        said.append(f"{len(done)} put back as they were ({listed(done)})")
    if kept:
        said.append(f"{len(kept)} left as they are: changed since, or not kept ({listed(kept)})")
    if back and turn.caveat:
        said.append(turn.caveat)
    what = f"your request \"{turn.label[:60]}\"" if back else f"the /undo of your request \"{turn.label[:60]}\""
    if not done:
        command = "/undo" if back else "/redo"
        return (f"Nothing was put back of the files {what} changed: " + ("; ".join(said) or "none differs") +
                f". Nothing changed, so {command} will try this request again.")
    opening = "[undo] files" if back else "[redo] files"
    ending = ". /redo reverses this." if back else "."
    return f"{opening} {what} changed: " + "; ".join(said) + ending


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
    what they read, as it is when they run: (the Undo, the workdir, say). Stop fires when the main
    agent's turn ends, however it ended."""
    def on_prompt(event: dict):
        current()[0].new_turn(event["prompt"])

    def before_tool(event: dict):
        undo, workdir, say = current()
        undo.at(workdir, say).before_change(event["name"])

    def after_turn(event: dict):
        current()[0].end_turn()  # fired however the main agent's turn ended
    return {"UserPromptSubmit": on_prompt, "PreToolUse": before_tool, "Stop": after_turn}
