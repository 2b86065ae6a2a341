"""The glob tool's search: the files under a folder that a pattern names, relative to the
workspace; never outside it, never .git. The pattern is matched a name at a time as
walk_tree walks the tree (workspace_files.py), so however many ** it holds, nothing
backtracks and nothing recurses.

Machinery the chapter does not need: the matches, and the folders that could not be listed,
come back as the text the model reads.
"""

import fnmatch
import os
from pathlib import Path

from .workspace_files import FOLDER, ToolError, resolved, utf8_name, walk_tree

GLOB_MAX_RESULTS = 200
GLOB_MAX_PARTS = 64     # a pattern of more folders than this is refused: no tree is that deep


def glob_files(workdir: Path, base: Path, pattern: str, path: str) -> str:
    """The files under base matching pattern, relative to the workspace; never outside it,
    never .git. A folder that could not be listed is named after the matches."""
    parts = Path(pattern).parts
    if Path(pattern).is_absolute() or ".." in parts:
        raise ToolError("glob patterns are relative to the workspace: drop the leading / and "
                        "any '..'.")
    if not parts or len(parts) > GLOB_MAX_PARTS:
        raise ToolError(f"a glob pattern names 1 to {GLOB_MAX_PARTS} levels of folders, such as "
                        "'**/*.py'.")
    root = workdir.resolve()
    depth = None if "**" in parts else len(parts)  # without **, nothing deeper can match
    matches, unlisted = [], []
    # a folder's places in the pattern, for its entries
    places = {str(base): past_stars({0}, parts)}
    for found, what in walk_tree(str(base), skip=frozenset({".git"}), depth=depth):
        if isinstance(what, OSError):
            unlisted.append(utf8_name(os.path.relpath(found, root)))
            continue
        folder, name = os.path.split(found)
        here = advance(places[folder], name, parts)
        if what == FOLDER:
            places[found] = here
        if len(parts) in here and inside(root, found):
            matches.append(utf8_name(os.path.relpath(found, root)))
    matches.sort()
    shown = "\n".join(matches[:GLOB_MAX_RESULTS]) or f"No files match {pattern!r} under {path}."
    if len(matches) > GLOB_MAX_RESULTS:
        shown += f"\n[showing {GLOB_MAX_RESULTS} of {len(matches)} matches; use a narrower pattern]"
    if unlisted:
        named = ", ".join(sorted(unlisted)[:10])
        shown += f"\n[{len(unlisted)} folder(s) could not be listed, so not searched: {named}]"
    return shown


def inside(root: Path, found: str) -> bool:
    """Whether a path the walk found stays in the workspace: only a link can lead out (or in a
    loop), as the walk never goes through one; and never .git, wherever base was."""
    if ".git" in Path(os.path.relpath(found, root)).parts:
        return False
    if not os.path.islink(found):
        return True
    real = resolved(Path(found))
    return real is not None and real.is_relative_to(root)


def advance(places: set, name: str, parts: tuple) -> set:
    """The places in a pattern's parts a path reaches by one more name, from the places its
    folder reached; a path matches when the place past the last part is among them. ** stands
    for any number of folders, none included. No backtracking, no recursion, however many **
    the pattern holds."""
    moved = set()
    for at in places:
        if at < len(parts) and parts[at] == "**":
            moved.add(at)
        elif at < len(parts) and fnmatch.fnmatch(name, parts[at]):
            moved.add(at + 1)
    return past_stars(moved, parts)


def past_stars(places: set, parts: tuple) -> set:
    """The places, and the place after each ** among them (a ** may stand for no folder)."""
    more = set(places)
    for at in range(min(places, default=len(parts)), len(parts)):
        if at in more and parts[at] == "**":
            more.add(at + 1)
    return more
