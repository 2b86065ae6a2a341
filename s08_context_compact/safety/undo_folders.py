"""The workspace as undo reaches it: each folder opened from the one that holds it, one name
at a time, never through a link (Folders), and what is read, written or removed in it named
relative to that folder's descriptor. A command that swaps a folder for a link at any moment
(another session's, in the same workspace) makes that path fail; nothing is written, removed
or read outside the workspace, and no path is ever too long to reach.

Files are copied a CHUNK at a time, hashed in the same read, or shared by a reflink where the
file system offers one (clone).

The walk (walk_folders) passes over folders a tool rebuilds or keeps: SKIPPED wherever they
are, SKIPPED_AT_TOP at the top of the workspace only (deeper, a folder of that name may be a
source), and any folder holding one of MARKERS (a virtual environment, a cache, whatever its
name). The program's own folders are not walked. Folders wait on a stack, not in a recursion:
a tree nested 1,000 deep would end one in a RecursionError.

Machinery the chapter does not need: undo.py decides what to record and put back.
"""

import errno
import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

from ..basics import OWN_FOLDERS, printable

try:
    import fcntl  # a reflink is asked for with an ioctl
except ImportError:  # Windows: plain copies
    fcntl = None

SKIPPED = {".git", "node_modules", "__pycache__"}  # wherever they are: never sources
# At the top of the workspace only: deeper, a folder of one of these names may be a source
SKIPPED_AT_TOP = {".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".hypothesis"}
# a folder holding one is a virtual environment, or a cache
MARKERS = {"pyvenv.cfg", "CACHEDIR.TAG"}
PASSED = "passed over"  # what the walk gives for a folder it does not enter
# A folder is opened by name from its parent's descriptor: never through a link (O_NOFOLLOW,
# and with O_DIRECTORY a link or a file fails as ENOTDIR), never kept open by a child program.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
FOLDER_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW
# A file the same way, and never waited on (a FIFO put there since it was looked at)
FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | NOFOLLOW
# What a folder's name failing to open as a folder means: it is gone, a file, or a link now
NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
# Folders on the way to the one in use stay open down to this depth, and every this many
# levels below it: a walk opens each folder about once, with a bounded number of descriptors
# however deep the tree (the soft limit is often 1,024).
HELD_DEPTH = 64
CHUNK = 1 << 20  # a file is read, hashed and copied a megabyte at a time
# Linux's request for a reflink, a copy that shares the file's blocks (Python names it from 3.12)
FICLONE = getattr(fcntl, "FICLONE", 0x40049409)  # (on Linux; never asked elsewhere)
# What undo asks of the system relative to a folder's descriptor. Windows offers none of it:
# there undo records nothing (and says so).
RELATIVE_CALLS = {os.open, os.stat, os.mkdir, os.rmdir, os.unlink, os.rename, os.symlink,
                  os.readlink}
RELATIVE = os.scandir in os.supports_fd and RELATIVE_CALLS <= os.supports_dir_fd


class Folders:
    """The workspace's folders, each opened from the one that holds it, one name at a time,
    never through a link: a folder swapped for a link at any moment fails to open instead of
    leading out of the workspace. What is read, written or removed is then named relative to
    the folder's descriptor. The folders on the way to the last one opened stay open (see
    HELD_DEPTH), so paths in order share them; a descriptor is good until the next open."""

    def __init__(self, root: Path):
        self.root = root
        self.parts = ()  # the names from the workspace to the last folder opened
        # depth -> descriptor, on the way to it; the workspace's at 0, from the first open
        self.held = {}

    def __enter__(self) -> "Folders":
        return self

    def __exit__(self, *exc) -> None:
        self.close_below(-1)

    def open(self, parts: tuple, make: bool = False) -> int:
        """The descriptor of the folder these names lead to, each made first if missing (when
        make). OSError if one is a link, a file or gone (ENOTDIR, ENOENT) or cannot be entered."""
        if not self.held:  # opened here, so a workspace gone fails as any folder gone does
            self.held[0] = os.open(self.root, FOLDER_FLAGS)
        if parts == self.parts:
            return self.held[len(parts)]
        self.close_below(shared_length(self.parts, parts))
        depth = max(self.held)
        self.parts = parts[:depth]
        while depth < len(parts):
            inner = self.open_in(depth, parts[depth], make)
            if depth >= HELD_DEPTH and depth % HELD_DEPTH:
                # between two held ones: opened again from the one above
                os.close(self.held.pop(depth))
            depth += 1
            self.held[depth] = inner
            self.parts = parts[:depth]
        return self.held[depth]

    def open_in(self, depth: int, name: str, make: bool) -> int:
        try:
            return open_folder_in(self.held[depth], name, make)
        except OSError as err:
            if err.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            where = shown("/".join((*self.parts, name)))
            now = f"{where} is a link or a file now, not a folder"
            raise NotADirectoryError(errno.ENOTDIR, now) from None

    def close_below(self, depth: int) -> None:
        """Close the folders deeper than depth (the way goes elsewhere; all of them, at the end)."""
        for level in [level for level in self.held if level > depth]:
            os.close(self.held.pop(level))
        self.parts = self.parts[:max(self.held, default=0)]


def open_folder_in(folder: int, name: str, make: bool = False) -> int:
    """The folder name in the open folder, made first if missing (when make); never a link."""
    if make:
        try:
            os.mkdir(name, dir_fd=folder)
        except FileExistsError:
            pass  # a folder (opened next), or a file or a link (refused next)
    return os.open(name, FOLDER_FLAGS, dir_fd=folder)


def shared_length(first: tuple, second: tuple) -> int:
    """How many names two paths start with in common."""
    common = 0
    for mine, theirs in zip(first, second):
        if mine != theirs:
            break
        common += 1
    return common


def parts_of(relative: str) -> tuple:
    """(the names of the folders that hold a relative path, its own name)."""
    *folders, name = relative.split("/")
    return tuple(folders), name


def skipped_by_name(name: str, top: bool) -> bool:
    """Whether a folder of this name is passed over where it is (top: in the workspace itself)."""
    return name in SKIPPED or top and name in SKIPPED_AT_TOP


def walk_folders(folders: Folders):
    """(relative path, its folder's names, its name, what it is) for each thing in the workspace
    that is not a folder the walk enters: None for a file, a link, a pipe (what is read next);
    PASSED for a folder passed over; the OSError that kept a folder from being listed."""
    stack = [()]
    while stack:
        parts = stack.pop()
        found = folder_names(folders, parts)
        if isinstance(found, OSError):
            yield "/".join(parts), parts[:-1], parts[-1] if parts else "", found
            continue
        if parts and any(marker in found for marker in MARKERS):  # a virtual environment, a cache
            yield "/".join(parts), parts[:-1], parts[-1], PASSED
            continue
        prefix = "".join(f"{part}/" for part in parts)
        for name, inner in found.items():
            if not inner:
                yield prefix + name, parts, name, None
            elif skipped_by_name(name, not parts):
                yield prefix + name, parts, name, PASSED
            elif parts or name not in OWN_FOLDERS:  # the program's own: not walked
                stack.append((*parts, name))


def folder_names(folders: Folders, parts: tuple):
    """{name: whether it is a folder (a link to one is not)} of what a folder holds; the
    OSError that kept it from being listed; {} when it is gone or a link now."""
    try:
        with os.scandir(folders.open(parts)) as listing:
            return {entry.name: real_folder(entry) for entry in listing}
    except OSError as err:
        return {} if err.errno in NOT_THERE else err


def real_folder(entry: os.DirEntry) -> bool:
    """A folder itself, not a link to one (a folder that cannot be looked at is read as a file)."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def passed_over(folder: int, name: str, relative: str) -> bool:
    """Whether undo passes over the folder name in the open folder, as its walk does: by its
    name, or by a marker it holds."""
    top = "/" not in relative
    if skipped_by_name(name, top):
        return True
    try:
        inner = open_folder_in(folder, name)
    except OSError:
        return False
    try:
        return any(holds(inner, marker) for marker in MARKERS)
    finally:
        os.close(inner)


def holds(folder: int, name: str) -> bool:
    """Whether the open folder holds something by this name."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return False
    return True


def remove_in(folder: int, name: str) -> None:
    """Take away name in the open folder, if there: a folder only when empty, a link itself."""
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return
    # Neither call follows a link: one put there since the stat fails, and stays
    if stat.S_ISDIR(info.st_mode):
        os.rmdir(name, dir_fd=folder)
    else:
        os.unlink(name, dir_fd=folder)


def new_file_in(folder: int) -> tuple:
    """(a descriptor, the name) of a new file, readable by you only, in the open folder."""
    for _ in range(100):
        name = f".undo-{os.urandom(6).hex()}"
        try:
            return os.open(name, NEW_FILE_FLAGS, 0o600, dir_fd=folder), name
        except FileExistsError:
            continue  # a name taken: (nearly) never twice
    raise FileExistsError(errno.EEXIST, "no free name for a temporary file")



def write_copy_in(folder: int, name: str, copy: Path, mode: int) -> None:
    """The file copy, with this mode, written beside name in the open folder, then renamed over
    it: whole or not at all; a link there is replaced, not followed."""
    descriptor, part = new_file_in(folder)
    try:
        with os.fdopen(descriptor, "wb") as out, open(copy, "rb") as source:
            if not clone(source.fileno(), out.fileno()):
                shutil.copyfileobj(source, out, CHUNK)
            os.fchmod(out.fileno(), mode)
        os.replace(part, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        remove_in(folder, part)  # the part written, if the rename did not take it


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


def shown(path: str) -> str:
    """A path as a line may show it: every control character visible, a line break and a tab
    among them (printable leaves those as text), so a name cannot make a line of its own."""
    return printable(path.replace("\t", "^I").replace("\n", "^J"))
