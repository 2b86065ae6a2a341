"""A record of the workspace, as undo compares two. Each path's entry is ("link", target),
(hash, mode) for a file, (None, mode) for one there but not kept, or (None, what it is) for
what undo passes over (a folder it skips, a pipe...). Here: which paths differ between two
records, and which of them /undo or /redo may change.

Machinery the chapter does not need: undo.py makes the records and puts files back by them.
"""

import stat

# A path's entry when what is there could not be seen: a folder that could not be listed, a
# path under one. Like a file not kept, it is never overwritten or removed, nor is what it holds.
UNSEEN = (None, "unseen")
# Entries of what undo passes over: no copy, never overwritten or removed, named by /undo
# when it is gone or made.
SKIPPED_FOLDER = (None, "a folder not recorded")
OTHER_KINDS = [(stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")]
NOT_RECORDED = {SKIPPED_FOLDER[1], *(kind for _, kind in OTHER_KINDS)}


def unrecorded(entry: tuple | None) -> bool:
    """Whether an entry is of something undo passes over (a folder it skips, a pipe...)."""
    return entry is not None and entry[0] is None and entry[1] in NOT_RECORDED


def changed(first: dict, second: dict) -> set:
    """The paths whose entries differ between two records."""
    return {path for path in first.keys() | second.keys() if first.get(path) != second.get(path)}


def holds_any(record: dict, folder: str) -> bool:
    """Whether a record has a path in the folder."""
    inside = folder + "/"
    return any(path.startswith(inside) for path in record)


def made_unrecorded(before: dict, after: dict) -> set:
    """The paths of what undo passes over that a turn made (a cache, a virtual environment):
    alone, they are no change /undo could take back, nor one it needs to name."""
    return {path for path, entry in after.items() if path not in before and unrecorded(entry)}


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
