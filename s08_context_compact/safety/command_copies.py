"""What a copy or a move may overwrite: cp, mv, install, ln and rsync write their last
operand (or -t DIR), a folder copied over another replaces the files it holds there, and a
file moved into the command's own /tmp is gone with the command.

Machinery the chapter does not need. Copies is a part of the Judge in command_risks.py: it
judges paths with the Judge's checks and asks through the Judge.
"""

import os
import re
from pathlib import Path

from .command_kinds import COPY_VALUES, COPY_WALK_LIMIT
from ..basics import FOLDER, walk_tree
from .shell_words import Word, make_word


class Copies:
    """The Judge's checks of cp, mv, install, ln and rsync."""

    def copy(self, name: str, args: list) -> None:
        """cp, mv, install, ln and rsync write their last operand (or -t DIR): a file there
        already is overwritten. rsync --delete deletes."""
        operands, target_dir, k = [], None, 0
        while k < len(args):
            word = args[k]
            if word in ("-t", "--target-directory") and k + 1 < len(args):
                target_dir = args[k + 1]
            elif word.startswith("--target-directory="):
                target_dir = make_word(word.split("=", 1)[1], word.expands)
            if word in COPY_VALUES[name]:
                k += 2
                continue
            operands += [] if word.startswith("-") else [word]
            k += 1
        flags = [word for word in args if word.startswith("-")]
        deletes = any(word.startswith(("--delete", "--remove-source")) for word in flags)
        if name == "rsync" and deletes:
            self.ask("deletes files (rsync --delete)")
        if target_dir is None and len(operands) < 2:
            return self.check_operands(operands)
        destination = target_dir if target_dir is not None else operands.pop()
        for source in operands:
            self.check_path(source, "moves" if name == "mv" else "reads")
        if name == "rsync" and re.match(r"^[^/]*:", destination):
            return self.ask(f"copies to another machine ({destination})")
        if name == "ln":  # ln replaces a file only with -f
            overwrite = any(w == "--force" or re.match(r"^-[a-zA-Z]*f", w) for w in flags)
        else:
            overwrite = not any(w == "--no-clobber" or re.match(r"^-[a-zA-Z]*n", w) for w in flags)
        for source in operands:
            self.check_scratch(name, source, destination, overwrite)
        # -T: the destination is the target
        onto = any(w == "--no-target-directory" or re.match(r"^-[a-zA-Z]*T", w) for w in flags)
        if name != "rsync" and onto:
            return self.copy_onto(name, operands[:1], destination, overwrite)
        self.copy_targets(name, operands, destination, overwrite)

    def check_scratch(self, name: str, source: Word, destination: Word, overwrite: bool) -> None:
        """Between the workspace and the command's own /tmp: moving a file there loses it with
        the command, and what is copied back from there, the host cannot see to check."""
        into = self.in_scratch(self.path(destination))
        out_of = self.in_scratch(self.path(source))
        if name == "mv" and into and not out_of:
            self.ask(f"moves {source} into {destination}, which is private to this command: "
                     "it is gone when the command ends")
        elif out_of and not into and overwrite and name != "ln" \
                and os.path.lexists(self.path(destination)):
            self.ask(f"copies {source} over {destination}: what the command's /tmp holds, "
                     "the host cannot check")

    def copy_onto(self, name: str, sources: list, target: Word, overwrite: bool) -> None:
        """Each source written as target itself: a file replaces it, a folder goes over it."""
        for source in sources:
            if not source.expands and not target.expands and os.path.isdir(self.path(source)):
                self.tree_over(name, self.path(source), self.path(target), overwrite)
            else:
                self.check_write(target, overwrite, how=name)

    def tree_over(self, name: str, source: Path, target: Path, overwrite: bool) -> None:
        """A folder copied (or moved) over target: each file it would replace there asks."""
        if not overwrite or not os.path.isdir(target):
            return
        if own := self.own_folder(target):
            return self.ask_writes_into(own)
        seen = 0
        for path, what in walk_tree(str(source)):  # no recursion: a tree may nest 1,000 deep
            if what == FOLDER:
                continue
            seen += 1
            if seen > COPY_WALK_LIMIT:
                return self.ask(f"copies a folder of over {COPY_WALK_LIMIT:,} files over "
                                f"{target} ({name})")
            if isinstance(what, OSError):  # what it would copy is unknown: said, not passed over
                return self.ask(f"copies {os.path.relpath(path, self.top)}, a folder that could "
                                f"not be looked into, over {target} ({name})")
            there = target / os.path.relpath(path, source)
            if os.path.lexists(there) and not os.path.isdir(there):
                return self.ask(f"overwrites {os.path.relpath(there, self.top)} ({name})")

    def copy_targets(self, name: str, sources: list, destination: Word, overwrite: bool) -> None:
        """A folder as the destination receives each source under its own name."""
        if destination.expands or not os.path.isdir(self.path(destination)):
            return self.check_write(destination, overwrite, how=name)
        if self.outside(destination):
            return None if self.refused_by_sandbox(self.path(destination)) else \
                self.ask(f"writes {self.leads(self.path(destination))}, outside the workspace")
        if own := self.own_folder(self.path(destination), itself=True):
            return self.ask_writes_into(own)
        for source in sources:
            if source.expands and overwrite:
                return self.ask(f"copies files named only when it runs into {destination} "
                                f"({name} {source})")
            names = self.matching(source) if source.globs else [str(self.path(source))]
            for found in names:
                target = self.path(destination) / os.path.basename(os.path.normpath(found))
                if os.path.isdir(found) and not os.path.islink(found):
                    # src/. copies what src holds, and so does rsync src/
                    dot = str(source).rstrip("/").endswith("/.") or str(source) in (".", "./")
                    inside = dot or name == "rsync" and str(source).endswith("/")
                    over = self.path(destination) if inside else target
                    self.tree_over(name, Path(found), over, overwrite)
                elif overwrite and os.path.lexists(target) and not os.path.isdir(target):
                    self.ask(f"overwrites {os.path.relpath(target, self.top)} ({name})")
