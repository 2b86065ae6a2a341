"""Undo of a turn. Before a turn's first call of a tool that may change the workspace (its
declaration says it writes, runs or starts a subagent), its files are recorded: each path
with a hash of its content, each content kept once. /undo puts back every file the turn
changed or deleted and takes away the ones it created; what it replaced is recorded first,
so /redo puts that back. A text check of commands always misses some form; this makes the
loss of a file cost nothing whatever form deleted it, within the session.

The copies are your files verbatim (a .env's keys included), so they live outside the
workspace, readable by you only: $XDG_STATE_HOME/s08/undo/ (else ~/.local/state/s08/undo/),
one folder a run, removed when the program ends (a day later, if it could not). A copy is
named by the sha256 of its content and kept once; where the filesystem offers reflinks
(btrfs, XFS), it shares the file's blocks. Bounded, each said once: no file over
MAX_FILE_BYTES, no workspace of over MAX_FILES files, copies under MAX_STORE_BYTES (the
oldest turns dropped first).

Not recorded, and named by /undo and /redo when gone or made (never put back, never taken
away): folders a tool rebuilds, virtual environments (undo_folders.py says which), pipes,
sockets, devices. Every path is reached from folder descriptors, never through a link
(undo_folders.py); every name printed shows its control characters (shown).

Undo runs no other program, git included (a repository's configuration can name a command
for git to run): a file comes back from undo's own copy, so a turn that deletes .git loses
no file undo kept.

A file whose size, times (ctime: any write sets it, nothing sets it back) and inode are
as at its last reading is not read again, which keeps a record fast. What /undo or /redo
overwrites or removes is read again and compared by content first: a person's edit of the
same size, its mtime put back (cp -p, touch -r, rsync -t), is left as it is.

Machinery the chapter does not need: undo_hooks start a turn, record before its first
change and at its end; undo_folders.py reaches each path, and undo_records.py compares two
records.
"""

import atexit
import itertools
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

from ..basics import one_line, printable, Tool, undo_folder
from .undo_folders import (FILE_FLAGS, NOT_THERE, PASSED, RELATIVE, Folders, copy_hashing,
                           parts_of, passed_over, remove_in, shown, walk_folders, write_copy_in)
from .undo_records import (OTHER_KINDS, SKIPPED_FOLDER, UNSEEN, changed, holds_any,
                           made_unrecorded, movable, unrecorded)

MAX_FILE_BYTES = 20_000_000
MAX_FILES = 50_000
MAX_STORE_BYTES = 500_000_000
SAY_RECORDING = 5_000       # a first record of more files than this says so before it starts
MAX_TURNS = 20              # turns that /undo can go back, one after another
STALE_SECONDS = 86_400      # a folder a run left behind (it was killed) is removed after a day
SHOWN_NAMES = 6             # /undo names this many paths of a kind, then counts the rest
# A file's times tick coarsely (a few ms on ext4, 2 s on FAT): a file changed this close to
# being read could change again, same size, within the same tick. Its stat key is not
# trusted, so the next record reads it again.
RACY_NS = 2 * 10**9


class StoreError(OSError):
    """The store could not take a copy (full, gone, not writable): the file is not to blame."""


class Turn(NamedTuple):
    """One turn's records: the workspace before its first change, and as the turn left it."""
    label: str
    before: dict
    after: dict | None = None  # None until the turn ends (or if recording its end was cut short)
    caveat: str = ""  # what /undo cannot put back because of how after was recorded; "" if nothing


class Outcome(NamedTuple):
    """What one /undo or /redo did with each path that differs between the two records."""
    done: list   # put back as the record has it
    kept: list   # left as it is: changed since, or its copy not kept
    lost: list   # not recorded (a folder undo skips, a pipe...), and gone or changed: not put back
    made: list   # not recorded, and not in the record it goes back to: not taken away
    same: list   # not recorded, and as the record it goes back to has it: nothing to do or say
    blocked: list  # a file to put back where something undo does not record stands now


class Undo:
    """The records of the turns that changed files, and the copies they point at."""

    def __init__(self, max_files: int = MAX_FILES):
        self.workdir, self.warn = None, print  # the workspace's, known from the first call
        self.max_files = max_files  # a workspace of more files than this is not recorded
        self.said = set()
        self.undo, self.redo = [], []  # Turns
        # relative path -> (stat key, hash); key None: it may not stand for the hash
        self.cache = {}
        self.store, self.stored, self.turn_recorded, self.label = None, 0, True, ""
        self.not_recorded = ""  # why the latest request that could not be recorded was not, named

    # ---- recording ----

    def new_turn(self, prompt: str) -> None:
        self.turn_recorded, self.label = False, prompt

    def at(self, workdir: Path, warn) -> "Undo":
        self.workdir, self.warn = workdir.resolve(), warn
        return self

    def before_change(self, tool: Tool | None) -> None:
        """Record the workspace before the turn's first call of a tool that may change it (its
        declaration says so: basics/tools.py)."""
        if tool is None or not tool.changes_files or self.turn_recorded:
            return
        self.turn_recorded = True
        problem = self.store_problem()
        if problem:
            why, line = problem
            self.not_recorded = f"request {quoted(self.label)} could not be recorded ({why})"
            return self.once("store", line)
        files = self.record()
        if files is None:
            self.not_recorded = (f"request {quoted(self.label)} could not be recorded "
                                 f"(the workspace has over {self.max_files:,} files)")
            return self.once("too many", f"[undo] the workspace has over {self.max_files:,} files: "
                                          "turns are not recorded, and /undo cannot put files back")
        self.undo = (self.undo + [Turn(self.label, files)])[-MAX_TURNS:]
        self.redo = []

    def check_store(self) -> None:
        """Said at start if no copy can be kept, before a request could lose a file."""
        problem = self.store_problem()
        if problem:
            self.once("store", problem[1])

    def store_problem(self) -> tuple | None:
        """(why no request can be recorded, in a few words; the line that says so, with what
        fixes it) when the store's folder cannot be made, or the system cannot open a file
        relative to a folder; None when a request can be recorded."""
        if not RELATIVE:
            return ("this system cannot open a file relative to a folder",
                    "[undo] this system cannot open a file relative to a folder, which undo "
                    "needs to never write through a link: /undo will not be able to put back what "
                    "a request changes")
        try:
            self.folder()
        except OSError as err:
            where = undo_folder()
            return ("no copy can be kept",
                    f"[undo] cannot keep copies of your files in {where} "
                    f"({err.strerror or err}): /undo will not be able to put back what a request "
                    "changes. Make that folder yours and writable, or set XDG_STATE_HOME to a "
                    "folder that is.")
        return None

    def record(self) -> dict | None:
        """{path: (hash, mode) or ("link", target)} of the workspace now, each content kept, and
        an entry for each thing passed over; None when it holds over max_files files."""
        with Folders(self.workdir) as folders:
            listed = list(itertools.islice(self.walk(folders), self.max_files + 1))
            if len(listed) > self.max_files:
                return None
            # the first record reads them all: say so
            if len(listed) > SAY_RECORDING and not self.cache:
                self.warn(f"[undo] recording the workspace's {len(listed):,} files before the "
                          "first change, so /undo can put them back…")
            files = {}
            for relative, folder, name, known in listed:
                entry = known or self.entry_in(folders, folder, name, relative, False)
                if entry is not None:
                    files[relative] = entry
            return files

    def record_paths(self, paths, fresh: bool = False) -> dict:
        """The record of these paths (relative) alone, each content kept; fresh: each read again
        whatever its stat says (/undo is about to overwrite or remove it, and decides that by
        its content alone). A path through a link is not there, as a walk never goes through one."""
        files = {}
        with Folders(self.workdir) as folders:
            for relative in sorted(paths):  # in order: the paths of a folder share its descriptor
                folder, name = parts_of(relative)
                entry = self.entry_in(folders, folder, name, relative, fresh)
                if entry is not None:
                    files[relative] = entry
        return files

    def walk(self, folders: Folders):
        """walk_folders' paths, each with its entry when it is known without reading it:
        SKIPPED_FOLDER for a folder passed over, UNSEEN for one that could not be listed (said
        once, and what it holds is never touched), None for what is read next."""
        for relative, folder, name, what in walk_folders(folders):
            if not isinstance(what, OSError):
                yield relative, folder, name, SKIPPED_FOLDER if what == PASSED else None
                continue
            where = shown(relative or ".")
            self.once(f"unlisted {where}",
                      f"[undo] {where}/ could not be listed ({what.strerror or what}): its files "
                      "are not recorded, and /undo will leave them as they are")
            if relative:  # the workspace itself has no entry
                yield relative, folder, name, UNSEEN

    def entry_in(self, folders: Folders, folder: tuple, name: str, relative: str, fresh: bool):
        """The entry of the name in the folder these names lead to: None when a folder on its way
        is gone, a file or a link; UNSEEN when one cannot be entered."""
        try:
            descriptor = folders.open(folder)
        except OSError as err:
            return None if err.errno in NOT_THERE else UNSEEN
        return self.entry(descriptor, name, relative, fresh)

    def entry(self, folder: int, name: str, relative: str, fresh: bool) -> tuple | None:
        """A path's entry in a record: ("link", target); (hash, mode) for a file, (None, mode)
        when it is there but not kept, UNSEEN when it cannot be looked at; (None, what it is)
        for what undo passes over; None when it is gone, or a folder undo walks into."""
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None  # gone since it was listed
        except OSError:  # a folder on its way that cannot be entered: unknown, so never touched
            return UNSEEN
        try:
            if stat.S_ISLNK(info.st_mode):
                return ("link", os.readlink(name, dir_fd=folder))
            if stat.S_ISREG(info.st_mode):
                return (self.keep(folder, name, relative, info, fresh), stat.S_IMODE(info.st_mode))
            if stat.S_ISDIR(info.st_mode):
                return SKIPPED_FOLDER if passed_over(folder, name, relative) else None
        except StoreError as err:  # the store full or gone: the file is there all the same
            self.once(f"not kept {relative}",
                      f"[undo] {shown(relative)} could not be kept ({err}): /undo will leave it "
                      "as it is")
            return (None, stat.S_IMODE(info.st_mode))
        except FileNotFoundError:
            return None  # gone since it was listed
        except PermissionError:  # there, but not kept: /undo leaves it as it is, never removes it
            return (None, stat.S_IMODE(info.st_mode))
        except OSError as err:
            # a full disk, an I/O error: there all the same, so never taken for absent
            self.once(f"not kept {relative}",
                      f"[undo] {shown(relative)} could not be kept ({err.strerror or err}): /undo "
                      "will leave it as it is")
            return (None, stat.S_IMODE(info.st_mode))
        return next(((None, kind) for test, kind in OTHER_KINDS if test(info.st_mode)), None)

    def keep(self, folder: int, name: str, relative: str, info, fresh: bool = False) -> str | None:
        """The content's hash, its copy kept once; None when it is too big to keep. A file
        whose stat key is the one cached is not read again, unless fresh."""
        cached = self.cache.get(relative)
        if cached and cached[0] == stat_key(info) and not fresh:
            return cached[1]
        if info.st_size <= MAX_FILE_BYTES:
            digest, key = self.copy_in(folder, name)
            if digest is not None:
                self.cache[relative] = (key, digest)
                return digest
        self.once(f"too big {relative}",
                  f"[undo] {shown(relative)} is over {MAX_FILE_BYTES // 10**6} MB: not kept, so "
                  "/undo cannot put it back")
        return None

    def copy_in(self, folder: int, name: str) -> tuple:
        """(the hash of the file name in the open folder, its copy kept, or None past
        MAX_FILE_BYTES; the stat key that may stand for this content next time, or None)."""
        source = os.open(name, FILE_FLAGS, dir_fd=folder)
        try:
            read_at = time.time_ns()
            info = os.fstat(source)  # before the read: a write during it moves ctime past this key
            if not stat.S_ISREG(info.st_mode):
                raise OSError("no longer a file")
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
            kept = {entry[0] for turn in self.undo + self.redo
                    for files in (turn.before, turn.after) if files
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
        since). A turn that changed nothing undo could put back or would have to name (a cache it
        made is neither) is forgotten. The record before it is never dropped: past max_files
        files, the end is recorded at the paths the turn started with."""
        if not self.undo or self.undo[-1].after is not None:
            return
        turn = self.undo[-1]
        after, caveat = self.record(), ""
        if after is None:
            after, caveat = self.record_paths(turn.before), self.too_many()
            self.warn(f"[undo] the workspace has over {self.max_files:,} files now: /undo can put "
                      "back what this request changed or deleted, but not take away the files it "
                      "created")
        if changed(turn.before, after) <= made_unrecorded(turn.before, after) and not caveat:
            self.undo.pop()
        else:
            self.undo[-1] = turn._replace(after=after, caveat=caveat)

    def step(self, back: bool) -> str:
        """/undo (back) or /redo: what the last recorded turn changed goes back to how it was
        before it (or, for /redo, after it); what has changed since is left as it is. One that
        changes nothing leaves both stacks as they were, unless all it found is what undo passes
        over (trying again could do no more)."""
        records = self.undo if back else self.redo
        if not records and back and self.not_recorded:
            return (f"Nothing to undo: your {self.not_recorded}, so /undo cannot put back what it "
                    "changed.")
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
        outcome = self.apply(source, target, present)
        if worth_trying_again(outcome):
            return told(back, ended, outcome)
        records.pop()
        (self.redo if back else self.undo).append(ended)
        return told(back, ended, outcome)

    def ended_now(self, turn: Turn) -> Turn:
        """A turn whose end was never recorded (recording it was cut short): the workspace now
        stands for its end, and what /undo says names that."""
        now = self.record()
        if now is None:
            return turn._replace(after=self.record_paths(turn.before), caveat=self.too_many())
        return turn._replace(after=now, caveat="its end was not recorded, so what changed since "
                                               "counts as its own")

    def too_many(self) -> str:
        return (f"the files it created are left: at its end the workspace had over "
                f"{self.max_files:,} files, too many to record")

    def apply(self, source: dict, target: dict, present: dict) -> Outcome:
        """Each path that differs between the records goes from source's state to target's,
        where it is still as source has it. Removals first (deepest first), then writes
        (shallowest first), so a link or a file in the way of a folder goes before the folder
        is made; nothing is ever written or removed through a link (Folders)."""
        def order(path: str) -> tuple:
            removed = target.get(path) is None
            return (not removed, -path.count("/") if removed else path.count("/"))
        blocked = [path for path in changed(source, target)
                   if unrecorded(present.get(path)) and not unrecorded(target.get(path))
                   and target.get(path)]
        # a pipe or a cache folder where a file was: undo never removes what it did not keep
        if blocked:
            return Outcome([], [], [], [], [], blocked)
        outcome = Outcome([], [], [], [], [], [])
        with Folders(self.workdir) as folders:
            for path in sorted(sorted(changed(source, target)), key=order):
                self.apply_path(folders, path, (source, target, present), outcome)
        return outcome

    def apply_path(self, folders: Folders, path: str, records: tuple, outcome: Outcome) -> None:
        """One path from source's state to target's, and the list of outcome it belongs in."""
        source, target, present = records
        cleared = unrecorded(source.get(path)) and present.get(path) is None and target.get(path)
        if cleared:  # what stood in the way (a pipe, a cache folder) is gone: the file comes back
            source = {**source, path: None}
        elif any(unrecorded(record.get(path)) for record in records):
            if present.get(path) == target.get(path):
                outcome.same.append(path)
            else:  # what undo passes over, not as it was
                (outcome.lost if unrecorded(target.get(path)) else outcome.made).append(path)
            return
        if not movable(path, source, target, present):
            outcome.kept.append(path)  # changed since, or a copy that was never kept: left as it is
            return
        try:
            if target.get(path) is None:
                self.remove(folders, path, target)
            else:
                self.write(folders, path, target[path])
            outcome.done.append(path)
        except OSError as err:  # its copy gone, a disk error, a link where a folder was
            outcome.kept.append(path)
            self.warn(f"[undo] could not put back {shown(path)}: {err.strerror or err}")

    def remove(self, folders: Folders, path: str, target: dict) -> None:
        """Take away what is at path (a link itself, never what it points to; a folder only
        empty), then the folders the turn made that are empty now."""
        parts, name = parts_of(path)
        remove_in(folders.open(parts), name)
        self.cache.pop(path, None)
        while parts and not holds_any(target, "/".join(parts)):
            try:  # folders the turn made, empty now
                os.rmdir(parts[-1], dir_fd=folders.open(parts[:-1]))
            except OSError:
                break
            parts = parts[:-1]

    def write(self, folders: Folders, path: str, entry: tuple) -> None:
        """Put entry at path: its folders made, a link made anew, a file written beside and renamed
        over what is there (whole or not at all; a link there is replaced, not followed)."""
        parts, name = parts_of(path)
        folder = folders.open(parts, make=True)
        try:  # a folder where the file was: empty by now, else this fails and it stays
            os.rmdir(name, dir_fd=folder)
        except (FileNotFoundError, NotADirectoryError):
            pass  # nothing there, or a file or a link: replaced below
        if entry[0] == "link":
            remove_in(folder, name)
            os.symlink(entry[1], name, dir_fd=folder)
        else:
            write_copy_in(folder, name, self.folder() / entry[0], entry[1])
        self.cache.pop(path, None)


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


def told(back: bool, turn: Turn, outcome: Outcome) -> str:
    """The line /undo or /redo prints: what was put back, what was left and why, what was
    not recorded. It opens with "[" only when files changed, so the model is told only
    then. Every name in it is shown, never obeyed."""
    said = []
    if outcome.blocked:
        said.append(f"{len(outcome.blocked)} cannot be put back while something undo does not "
                    f"record (a pipe, a cache folder) stands where each was "
                    f"({listed(outcome.blocked)}); move it away")
    if outcome.done:
        said.append(f"{len(outcome.done)} put back as they were ({listed(outcome.done)})")
    if outcome.kept:
        kept = listed(outcome.kept)
        said.append(f"{len(outcome.kept)} left as they are: changed since, or not kept ({kept})")
    if outcome.lost:
        said.append(f"{len(outcome.lost)} not recorded, so not put back ({listed(outcome.lost)})")
    if outcome.made:
        said.append(f"{len(outcome.made)} not recorded, so not taken away ({listed(outcome.made)})")
    if outcome.same and not said:  # only then: what undo passes over, as it was, is no news
        said.append(f"{len(outcome.same)} not recorded, and already as they were "
                    f"({listed(outcome.same)})")
    if back and turn.caveat:
        said.append(turn.caveat)
    request = quoted(turn.label)
    what = f"your request {request}" if back else f"the /undo of your request {request}"
    command = "/undo" if back else "/redo"
    if worth_trying_again(outcome):
        return (f"Nothing was put back of the files {what} changed: "
                + ("; ".join(said) or "none differs")
                + f". Nothing changed, so {command} will try this request again.")
    if not outcome.done:
        return f"Nothing was put back of the files {what} changed: " + "; ".join(said) + "."
    opening = "[undo] files" if back else "[redo] files"
    ending = ". /redo reverses this." if back else "."
    return f"{opening} {what} changed: " + "; ".join(said) + ending


def worth_trying_again(outcome: Outcome) -> bool:
    """Whether a /undo or /redo that put nothing back keeps the request where it was: what it
    left may be as the record has it again later (or nothing differs now); what undo passes
    over never will be."""
    return not outcome.done and bool(outcome.kept or outcome.blocked or
                                     not outcome.lost + outcome.made + outcome.same)


def listed(paths: list) -> str:
    """A few paths, shown; how many more there are."""
    names = ", ".join(shown(path) for path in paths[:SHOWN_NAMES])
    return names + (f" and {len(paths) - SHOWN_NAMES:,} more" if len(paths) > SHOWN_NAMES else "")


def quoted(label: str) -> str:
    """A request, as /undo names it: in quotes, on one line, cut short."""
    return f"\"{one_line(printable(label), 60)}\""


def running(pid: str) -> bool:
    """Whether a program with this process id still runs (its copies are still wanted)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


class ForUndo(NamedTuple):
    """What undo's hooks read of the session, as it is when they run."""
    undo: Undo
    workdir: Path
    say: Callable[..., None]


def undo_hooks() -> dict:
    """The record taken before a turn's first change, as hooks beside the ledger's. Each
    hook(event, now) is handed what it reads as a ForUndo, as it is when it runs. Stop fires
    when the main agent's turn ends, however it ended."""
    def on_prompt(event: dict, now: ForUndo):
        now.undo.new_turn(event["prompt"])

    def before_tool(event: dict, now: ForUndo):
        now.undo.at(now.workdir, now.say).before_change(event.get("tool"))

    def after_turn(event: dict, now: ForUndo):
        now.undo.end_turn()  # fired however the main agent's turn ended
    return {"UserPromptSubmit": on_prompt, "PreToolUse": before_tool, "Stop": after_turn}
