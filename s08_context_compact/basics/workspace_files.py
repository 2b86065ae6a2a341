"""Safe file I/O in the workspace: paths that cannot escape it, writes that leave the old
file whole when they fail, files read line by line however big they are, and the
project's own instructions for agents (AGENTS.md) read safely for the system prompt. The
workspace is often a repository just cloned, so what it holds is not trusted: the
program's own folders must be real folders (never a planted link), and skills are read
only from regular files.

Machinery the chapter does not need: the file tools' work is done here, and walk_tree
walks the workspace without recursing; glob_search.py matches the glob tool's patterns
on that walk.
"""

import functools
import os
import re
import stat
import sys
import tempfile
from pathlib import Path

from .places import DOTENV_EXAMPLE, OWN_DOTENV, OWN_FOLDERS, PROGRAM
from .redaction import REDACTED, Redactor, put_back, redact
from .surrogates import well_formed

READ_MAX_CHARS = 200_000            # one read_file call returns at most this much
READ_MAX_LINE_CHARS = 2_000         # minified files: cut single lines, not whole reads
EDIT_MAX_BYTES = 10_000_000         # edit_file loads the whole file: refuse bigger ones
SKILL_MAX_BYTES = 100_000           # a SKILL.md bigger than this is skipped, not read
# the project's instructions for agents: the first one there
INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md")
# about 5,000 tokens, sent with every request; a longer file is cut
INSTRUCTIONS_MAX_CHARS = 20_000
INSTRUCTIONS_TAG = "project_instructions"


# Opening what a workspace holds: never through a final link, never blocking on a pipe, never
# taking a terminal. (Windows has none of these flags; there they are 0.)
NO_LINK = getattr(os, "O_NOFOLLOW", 0)
SAFE_OPEN = NO_LINK | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


class ToolError(Exception):
    """A tool failure the model can act on; the message says what to try next."""


def resolved(path: Path) -> Path | None:
    """The path with every link followed; None when that cannot be done: a loop of links
    (which a cloned repository may hold), a name too long, a NUL."""
    try:
        real = path.resolve()
    except (RuntimeError, OSError, ValueError):  # RuntimeError: the loop, on Python before 3.13
        return None
    # From Python 3.13 a loop is no error: the link that could not be followed stays in the path.
    return None if any(os.path.islink(part) for part in (real, *real.parents)) else real


def on_disk(folder: Path, path) -> Path:
    """folder / path, each name in it that the model was shown with U+FFFD (a name whose bytes
    are not UTF-8: well_formed) put back to the one name on disk shown that way. A name that
    exists as written, or that two names on disk are both shown as, stays as written."""
    place = folder / path
    if "\ufffd" not in str(path):
        return place
    found = Path(place.parts[0])
    for name in place.parts[1:]:
        if "\ufffd" in name and not os.path.lexists(found / name):
            name = shown_as(found, name) or name
        found = found / name
    return found


def shown_as(folder: Path, shown: str) -> str | None:
    """The one name in folder that well_formed shows as shown, or None."""
    try:
        names = [name for name in os.listdir(folder) if well_formed(name) == shown]
    except OSError:
        return None
    return names[0] if len(names) == 1 else None


def inside_workspace(workdir: Path, path: str) -> Path | None:
    """Resolve a path (symlinks included, a name shown with U+FFFD put back: on_disk); None
    when it lands outside the workspace, or nowhere (a loop of links)."""
    root = workdir.resolve()
    target = resolved(on_disk(root, path))
    inside = target is not None and (target == root or target.is_relative_to(root))
    return target if inside else None


def workspace_path(workdir: Path, path: str) -> Path:
    """inside_workspace, or a ToolError that tells the model what to do instead."""
    target = inside_workspace(workdir, path)
    if target is None:
        raise ToolError(f"{path} is outside the workspace {workdir}. Use a path inside it.")
    return target


@functools.cache  # the same for the whole run: the permission check asks it at every write
def program_places() -> tuple:
    """What the program runs or reads when it starts, as real paths: its code, .env.example,
    and the Python that runs it (the interpreter, its prefixes, the base installation a
    virtual environment was made from, every folder on sys.path, and the user site where
    that Python reads one, made or not; the folder of compiled code PYTHONPYCACHEPREFIX
    names). A command must not change them: the next start would run that change outside any
    sandbox (a sitecustomize.py, a .pth, a patched module, a rewritten .pyc)."""
    import site  # only here: the list is asked for once, at start-up
    import sysconfig
    places = [PROGRAM, DOTENV_EXAMPLE, sys.executable, sys.prefix, sys.exec_prefix,
              sys.base_prefix, sys.base_exec_prefix, *site.getsitepackages(),
              *sysconfig.get_paths().values(), *sys.path]
    found = [os.path.realpath(place) for place in places if place and os.path.exists(place)]
    if site.ENABLE_USER_SITE:  # never inside a virtual environment
        found.append(os.path.realpath(site.getusersitepackages()))
    if sys.pycache_prefix:  # PYTHONPYCACHEPREFIX: the compiled code of all the above, made or not
        found.append(os.path.realpath(sys.pycache_prefix))
    return tuple(dict.fromkeys(found))


def in_program(workdir: Path, path) -> str | None:
    """The place of program_places() (or the program's own .env) a path in the workspace is
    in, if any. A place that holds the workspace does not count: working in the program's
    own folder, or in /usr under a system Python, every path would."""
    root, target = workdir.resolve(), resolved(on_disk(workdir.resolve(), path))
    if target is None:
        return None
    places = [Path(os.path.realpath(place)) for place in [OWN_DOTENV, *program_places()]]
    return next((str(place) for place in places
                 if target.is_relative_to(place) and not root.is_relative_to(place)), None)


def in_own_folder(workdir: Path, path, itself: bool = True) -> str | None:
    """The program's own folder a path in the workspace is in, if any (links followed);
    unless itself, the folder itself does not count."""
    target, root = resolved(on_disk(workdir.resolve(), path)), workdir.resolve()
    return next((own for own in OWN_FOLDERS
                 if target is not None and target.is_relative_to(root / own)
                 and (itself or target != root / own)), None)


def path_risk(workdir: Path, path: str, writes: bool) -> tuple:
    """The permission check's decision for a file tool's path, with the reason: outside the
    workspace is refused, and so is a write into the program's own folders; a write to its
    code or settings asks (a learner may want the lesson changed: the person decides)."""
    if inside_workspace(workdir, path) is None:
        return "deny", f"{path} is outside the workspace {workdir}"
    if writes and (own := in_own_folder(workdir, path)):
        return ("deny", f"{path} is in {own}/, the program's own folder (session logs, "
                "saved outputs)")
    if writes and (code := in_program(workdir, path)):
        return ("ask", f"changes {path}, in {code}: the program's own code or settings, which "
                "the next start runs")
    return "allow", ""


def own_folder(workdir: Path, relative) -> Path:
    """One of the program's own folders (.transcripts, .task_outputs/tool-results, ...),
    made if missing. Each part must be a real folder: a cloned repository may have planted
    a link there, to make the program write outside the workspace, or a file. Either is
    refused with an OSError that says so; nothing is ever written through it."""
    folder = workdir
    for part in Path(relative).parts:
        folder = folder / part
        try:
            os.mkdir(folder)
        except FileExistsError:
            pass
        mode = os.lstat(folder).st_mode
        if not stat.S_ISDIR(mode):
            what = f"a link to {os.readlink(folder)}" if stat.S_ISLNK(mode) else file_kind(mode)
            raise OSError(f"{folder.relative_to(workdir)} is {what}, not a folder: the program "
                          "writes only into real folders inside the workspace; remove or rename it")
    return folder


def file_kind(mode: int) -> str:
    kinds = [(stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), "a device")


def open_regular(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of path, which must be a regular file: never a link (however dangling),
    a pipe that would block the open forever, or a device such as /dev/zero that never
    ends. OSError saying what it is otherwise."""
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode):
        fd = os.open(path, flags | SAFE_OPEN)
        mode = os.fstat(fd).st_mode  # what was opened, in case it was swapped since
        if stat.S_ISREG(mode):
            return fd
        os.close(fd)
    raise OSError(f"{file_kind(mode)}, not a regular file")


def holds_exactly(path: Path, data: bytes) -> bool:
    """Whether path is a regular file with exactly these bytes."""
    try:
        if os.lstat(path).st_size != len(data):
            return False
        with open(open_regular(path), "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False


def open_log(path: Path, *, new: bool):
    """A session log opened to append; whether it was created. Its folder is one of the
    program's own, right in the workspace; the file must be regular. new: create it, and
    fail rather than append to a file someone else put there."""
    own_folder(path.parent.parent, path.parent.name)
    if not new:
        try:
            fd = open_regular(path, os.O_WRONLY | os.O_APPEND)
            return open(fd, "a", encoding="utf-8"), False
        except FileNotFoundError:
            pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | NO_LINK, 0o666)
    return open(fd, "a", encoding="utf-8"), True


def output_names(folder: Path, tool_use_id: str):
    """Where a tool call's output may go: <id>.txt, then <id>-1.txt, ... (a bounded number)."""
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", tool_use_id)[:80] or "result"
    for attempt in range(1000):
        yield folder / (f"{stem}.txt" if attempt == 0 else f"{stem}-{attempt}.txt")


def read_lines(target: Path, path: str, offset: int, limit: int, secrets=()) -> str:
    """Numbered lines of a text file, secrets redacted; a binary file is refused with what
    to use instead."""
    with open(target, "rb") as f:
        if b"\0" in f.read(8192):
            raise ToolError(f"{path} is a binary file ({target.stat().st_size:,} bytes); "
                            "read_file shows text only. Use bash (for example `file` or "
                            "`xxd | head`) to inspect it.")
        f.seek(0)
        return numbered_lines(f, path, offset, limit, Redactor.of(secrets))


def bounded_lines(f):
    """Lines of a binary file, each cut to a few KB: a 1 GB file with no newline never
    lands in memory whole."""
    while raw := f.readline(READ_MAX_LINE_CHARS * 4):
        if not raw.endswith(b"\n"):
            while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass  # skip the rest of an overlong line, a megabyte at a time
        yield raw


def numbered_lines(f, path: str, offset: int, limit: int, secrets: Redactor) -> str:
    # Reads line by line, so a 1 GB file costs only the lines asked for. Secrets go before
    # any line is cut, and are looked for across lines too: a key in .env spans several.
    lines, size, number, more = [], 0, 0, None
    for number, raw in enumerate(bounded_lines(f), start=1):
        if number < offset:
            continue
        if number >= offset + limit or size > READ_MAX_CHARS:
            more = number
            break
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        # bounded_lines may cut it
        lines.append(line if raw.endswith(b"\n") else secrets.redact(line, cut_end=True))
        size += min(len(line), READ_MAX_LINE_CHARS) + 8
    out = [f"{n:>6}\t{cut_line(line)}"
           for n, line in enumerate(secrets.redact_lines(lines), start=offset)]
    if more:
        out.append(f"[more lines follow; call read_file with offset={more} to continue]")
    if not out:
        return f"(empty: {path} has {number} lines; offset {offset} is past the end)" if number \
            else f"(empty file: {path})"
    return "\n".join(out)


def cut_line(line: str) -> str:
    return line if len(line) <= READ_MAX_LINE_CHARS else \
        line[:READ_MAX_LINE_CHARS] + f" [line cut at {READ_MAX_LINE_CHARS} chars]"


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(target: Path, data: bytes) -> None:
    """Write beside the target, flush to disk, then rename over it: a write that fails
    half-way (a full disk, say) leaves the original file exactly as it was. The temporary
    name is short, so a file whose name is near the 255-byte limit can be written too."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~current_umask()
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".s08-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, mode)  # the file keeps its permissions (a new one gets the usual ones)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_in_place(target: Path, data: bytes) -> None:
    """Rewrite a file through its own inode, so its other hard links show the new content
    too. The space is reserved first: a full disk fails before any byte changes."""
    fd = os.open(target, os.O_WRONLY | NO_LINK)
    try:
        size = os.fstat(fd).st_size
        if len(data) > size and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, len(data))
            except OSError:
                os.ftruncate(fd, size)  # whatever was reserved goes back; the content never changed
                raise
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(data)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.close(fd)


def replace_content(target: Path, path: str, data: bytes) -> None:
    """Give a file new content, or create it. A file its owner made read-only is refused,
    not replaced; a file with other hard links is rewritten in place, so the links keep
    sharing one content; any other file is replaced atomically (write_atomically)."""
    info = target.stat() if target.exists() else None
    if info and (not info.st_mode & 0o222 or not os.access(target, os.W_OK)):
        raise ToolError(f"{path} is read-only (mode {stat.S_IMODE(info.st_mode):04o}): someone "
                        "protected it against changes, so it was left as it is. Ask the user "
                        "before changing it.")
    try:
        if info and info.st_nlink > 1:
            write_in_place(target, data)
        else:
            write_atomically(target, data)
    except OSError as err:
        raise ToolError(f"could not write {path} ({err.strerror or err}); the file is "
                        "unchanged.") from None


def utf8_name(name: str) -> str:
    """A file name whose bytes are not UTF-8, with those bytes as \ufffd: it can be logged and
    sent to the model (an undecodable name arrives with lone surrogates). It keeps any
    control characters the name has; terminal.printable shows them, where the name reaches
    the screen."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def current_text(target: Path) -> str:
    """What a file holds, for putting secrets back: "" when it is not a regular UTF-8 file
    of a size edit_file takes (a new file among them)."""
    try:
        with open(open_regular(target), "rb") as f:
            return f.read(EDIT_MAX_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def keep_secrets(path: str, content: str, original: str, secrets: Redactor) -> str:
    """content with each [redacted] the model copied put back to the secret it stood for
    (redaction.put_back); refused when one cannot be placed, so a key on disk never
    becomes the placeholder."""
    if REDACTED not in content or not secrets:
        return content
    restored = put_back(secrets, content, original)
    if restored is None:
        raise ToolError(f"{path} holds secrets you were shown as {REDACTED}, and your text has "
                        f"{REDACTED} where it is not clear which one it stands for; writing it "
                        "would replace a real value with that placeholder. Leave the lines that "
                        "hold secrets as they are (change the lines around them with edit_file), "
                        "or ask the user to change those values.")
    return restored


def write_file(target: Path, path: str, content: str, secrets: Redactor = Redactor()) -> str:
    """Create or replace a file; a write that fails leaves the old one as it was, and a
    secret it held is never replaced by the placeholder the model saw."""
    target.parent.mkdir(parents=True, exist_ok=True)
    original = current_text(target) if REDACTED in content else ""
    content = keep_secrets(path, content, original, secrets)
    data = content.encode("utf-8", "surrogatepass")
    replace_content(target, path, data)
    return f"Wrote {len(data):,} bytes to {path}"


def occurrences(text: str, part: str) -> int:
    """How often part occurs in text, overlapping matches included ("aba" is twice in
    "ababa"): str.count would call that one match, and the edit would be a guess."""
    count = text.count(part) if part else 0
    if count == 1 and text.find(part, text.find(part) + 1) != -1:
        count = 2  # the one match str.count saw overlaps another
    return count


def edit_file(target: Path, path: str, old_text: str, new_text: str,
              secrets: Redactor = Redactor()) -> str:
    """Replace the one occurrence of old_text (as the model was shown it, secrets as
    [redacted], if need be); the file is left whole if anything fails."""
    if not target.is_file():
        raise ToolError(f"{path} not found. Call glob to list files, or write_file to create it.")
    if target.stat().st_size > EDIT_MAX_BYTES:
        raise ToolError(f"{path} is {target.stat().st_size:,} bytes, too big for edit_file; "
                        "use bash (sed, patch).")
    try:
        text = target.read_bytes().decode("utf-8")  # bytes, so CRLF and lone CR stay as they are
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not UTF-8 text; edit_file cannot change it safely. Use bash.")
    count = occurrences(text, old_text)
    if count == 0 and "\r\n" in text and "\n" in old_text and "\r" not in old_text + new_text:
        # read_file shows lines without their CR: match the file's own line endings
        old_text, new_text = old_text.replace("\n", "\r\n"), new_text.replace("\n", "\r\n")
        count = occurrences(text, old_text)
    original = text
    if count == 0 and REDACTED in old_text and secrets:  # copied from what read_file showed
        text = "\n".join(secrets.redact_lines(text.split("\n")))
        count = occurrences(text, old_text)
    if count != 1:
        hint = "read the file again and copy the exact text (whitespace matters)" if count == 0 \
            else "include more surrounding lines so it matches exactly once"
        raise ToolError(f"old_text was found {count} times in {path} (overlapping matches "
                        f"count); it must occur exactly once: {hint}.")
    edited = keep_secrets(path, text.replace(old_text, new_text, 1), original, secrets)
    replace_content(target, path, edited.encode("utf-8"))
    return f"Edited {path}"


FOLDER, OTHER = "folder", "other"


def walk_tree(top: str, skip: frozenset = frozenset(), depth: int | None = None):
    """(path, what) for everything under the folder top, what being FOLDER, OTHER (a file, a
    link, a pipe: all that is not a folder), or the OSError that kept a folder from being
    listed. A link is never followed; a folder named in skip is neither given nor entered, nor
    one depth levels down. Folders wait on a stack, not in a recursion: os.walk and pathlib's
    ** recurse before Python 3.12, and a tree nested 1,000 deep ends them in a RecursionError."""
    stack = [(top, 1)]
    while stack:
        folder, level = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone, or a file now: nothing under it to give
        except OSError as err:
            yield folder, err
            continue
        for entry in entries:
            if not real_folder(entry):
                yield entry.path, OTHER
            elif entry.name not in skip:
                yield entry.path, FOLDER
                if depth is None or level < depth:
                    stack.append((entry.path, level + 1))


def real_folder(entry: os.DirEntry) -> bool:
    """A folder itself, not a link to one (a folder that cannot be looked at is walked as a
    file)."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def discover_skills(folders: list, warn=print) -> dict:
    """Find skills/<name>/SKILL.md files; front matter gives name and description. A skill
    that cannot be read safely (read_skill) is skipped, and warn() says why, a line each."""
    skills = {}
    for folder in map(Path, folders):
        for path in sorted(folder.glob("*/")) if folder.is_dir() else []:
            path = path / "SKILL.md"
            if not os.path.lexists(path):
                continue
            try:
                text = read_skill(folder.parent, path)
            except OSError as err:
                warn(f"[skills] skipped {utf8_name(str(path.relative_to(folder.parent)))}: {err}")
                continue
            match = re.match(r"^---\s*\n(.*?)\n---\s*\n?(.*)$", text, re.S)
            meta = dict(re.findall(r"^(\w+):\s*(.+?)\s*$", match.group(1), re.M)) if match else {}
            # load_skill is called with the name shown
            name = well_formed(meta.get("name", path.parent.name))
            skills.setdefault(name, {"description": meta.get("description", ""),
                                     "body": (match.group(2) if match else text).strip(),
                                     "path": path})
    return skills


def read_skill(root: Path, path: Path) -> str:
    """The text of a SKILL.md under root (the workspace, or the program's own folder).
    What a cloned repository put there is not trusted: a link may lead to a private file
    outside, a pipe would block start-up forever, /dev/zero never ends. So it must lead
    to a regular file inside root, of at most SKILL_MAX_BYTES; else OSError says why."""
    real = resolved(path)
    if real is None:
        raise OSError("a loop of links")
    if not real.is_relative_to(root.resolve()):
        raise OSError(f"it leads to {real}, outside {root}")
    try:
        fd = open_regular(real)
    except FileNotFoundError:
        raise OSError("a link to nothing") from None
    with open(fd, "rb") as f:
        data = f.read(SKILL_MAX_BYTES + 1)
    if len(data) > SKILL_MAX_BYTES:
        raise OSError(f"larger than {SKILL_MAX_BYTES:,} bytes")
    return data.decode("utf-8", "replace")


def read_workspace_file(workdir: Path, name: str, max_bytes: int) -> tuple | None:
    """(the first max_bytes of a file in the workspace, its size); None when there is no
    such file. ToolError when it is there but not to be read: a symlink that leads out of
    the workspace (or round in a loop), or not a regular file (open_regular)."""
    target = inside_workspace(workdir, name)
    if target is None:
        raise ToolError(f"{name} leads outside the workspace")
    try:
        with open(open_regular(target), "rb") as f:
            return f.read(max_bytes), os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ToolError(f"{name} cannot be read ({err.strerror or err})") from None


def project_instructions(workdir: Path, secrets: list) -> tuple:
    """(the project's instructions for agents, ready for the system prompt, or ""; notes for
    the person). AGENTS.md, else CLAUDE.md, at the top of the workspace; secrets redacted;
    cut at INSTRUCTIONS_MAX_CHARS, with a note saying where the rest is."""
    notes = []
    for name in INSTRUCTION_FILES:
        try:
            found = read_workspace_file(workdir, name, INSTRUCTIONS_MAX_CHARS * 4)
        except ToolError as err:
            notes.append(f"[instructions] {err}; not read.")
            continue
        if found is None:
            continue
        data, size = found
        text = redact(data.decode("utf-8", "replace"), secrets).strip()
        if len(text) > INSTRUCTIONS_MAX_CHARS or size > len(data):
            kept = text[:INSTRUCTIONS_MAX_CHARS].rsplit("\n", 1)[0]  # cut between lines
            text = (f"{kept}\n[{name} is {size:,} bytes; cut here, at {len(kept):,} characters: "
                    f"read_file {name} for the rest]")
            notes.append(f"[instructions] {name} is {size:,} bytes; requests carry its first "
                         f"{len(kept):,} characters (the bound is {INSTRUCTIONS_MAX_CHARS:,}).")
        return (f"The project's instructions for agents, from its {name} (they hold for the "
                "whole session):\n"
                f'<{INSTRUCTIONS_TAG} file="{name}">\n{text}\n</{INSTRUCTIONS_TAG}>'), notes
    return "", notes
