"""What start-up checks before the first prompt: the .env files, the settings a person
types by hand (a key with a newline pasted in, a base URL with a typo or a trailing /v1),
and whether the endpoint knows the model. Each mistake is one line that names the
setting and the fix, never a traceback, and never a retry blamed on the network.

Machinery the chapter does not need. Each check returns a note, or raises StartupError,
and builds nothing: cli.py, beside it, gathers the notes into the configuration. Here too
are build_system_prompt, the system prompt, and open_session, which opens the agent's
session log (session/ keeps its records).
"""

import difflib
import errno
import io
import os
import re
import stat
from pathlib import Path
from urllib.parse import urlsplit

from ..basics import TOOL_RESULTS_DIR, well_formed
from ..endpoint import anthropic, httpx2
from ..safety import changed_by_command, passes_through
from ..session import LogSetup, open_session_log

DOTENV_MAX_BYTES = 1_000_000        # a .env is a few lines; this is only a bound on reading one
TRIMMED = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "MODEL_ID", "ANTHROPIC_BASE_URL")
CREDENTIALS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
CLOSEST_MODELS = 5                  # model ids suggested when MODEL_ID is not found


class StartupError(Exception):
    """A setting the program cannot start with; the message names it and the fix."""


# The program's settings: the names .env.example documents, and the only ones a .env gives.
# Any other name a cloned repository's .env could set would act outside the sandbox:
# LD_PRELOAD runs its library in every program started, PYTHONPATH its code, and a proxy
# setting sends each request, your key in its headers, through a host it chose.
SETTINGS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "MODEL_ID", "ANTHROPIC_BASE_URL",
            "CONTEXT_WINDOW", "API_CONNECT_TIMEOUT", "API_IDLE_TIMEOUT", "API_RETRIES", "CACHE_TTL",
            "COMPACT_AT",
            "SUMMARY_AHEAD", "SANDBOX", "SANDBOX_NETWORK", "S08_HISTORY",
            "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")
# Of those, what only your shell or the program's own .env may set: a proxy moves your key,
# and the others guard the machine from the folder's content (the sandbox, the history file
# it hides). ANTHROPIC_BASE_URL is kept apart: a folder may name its endpoint for its own key.
PROXIES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")
OWN_ONLY = ("SANDBOX", "SANDBOX_NETWORK", "S08_HISTORY", *PROXIES)


def load_dotenv_files(paths: list, own: Path | None) -> tuple:
    """Put the program's settings from each .env file into the environment, in order: a
    variable already set (and not empty) wins, so the working folder's file wins over the
    next. From a file other than own, names in OWN_ONLY are left out, and ${VAR} is taken as
    it is: expanded, it could send any variable of yours to the host the file names. From any
    file, names that are not in SETTINGS are left out. Returns ({path: {name: value}}, a note
    naming what was left out). A folder named .env (often a virtual environment) or anything
    else that is not a regular file is passed over; a file that cannot be read, or is not
    UTF-8, is a StartupError."""
    found, ignored = {}, {}
    for path in paths:
        mine = same_file(path, own)
        values = read_dotenv(path, expand=mine)
        if values is None or path in found:  # (the working folder may be the repository root)
            continue
        found[path] = values
        for name, value in values.items():
            if name not in SETTINGS or name in OWN_ONLY and not mine:
                ignored.setdefault(path, []).append(name)
            elif value is not None and not os.environ.get(name, "").strip():
                os.environ[name] = value  # set but empty is not set
    return found, ignored_note(ignored)


def read_dotenv(path: Path, expand: bool) -> dict | None:
    """{name: value} of one .env file; None when there is none (or a folder is in its place).
    With expand, ${VAR} in a value is replaced by the variable's value."""
    from dotenv import dotenv_values  # imported here so that importing this file does no work
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # not a file: opening a FIFO would wait forever
        with open(path, "rb") as f:
            data = f.read(DOTENV_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM):
            fix = f"Make it readable (chmod 600 {path})"
        elif err.errno == errno.ELOOP:
            fix = "It is a loop of links: make it a file"
        else:
            fix = "Make it readable"
        raise StartupError(f"{path} cannot be read ({err.strerror or err}). "
                           f"{fix} or remove it.") from None
    return dotenv_values(stream=io.StringIO(dotenv_text(path, data)), interpolate=expand)


def unread_dotenv(path: Path) -> str:
    """Why a .env that is there was not read, in one line ("" when nothing is there)."""
    if os.path.islink(path) and not os.path.exists(path):
        return (f"[config] {path} is a link to {os.readlink(path)}, which does not exist: "
                "nothing is read from it.")
    if os.path.isdir(path):
        return (f"[config] {path} is a folder (a virtual environment?), not a file of settings: "
                "it is passed over.")
    return ""


def same_file(path: Path, other: Path | None) -> bool:
    if other is None:
        return False
    try:
        return path.resolve() == other.resolve()
    except (OSError, RuntimeError):  # a loop of links
        return False


def ignored_note(ignored: dict) -> str:
    """One line naming what .env files set that the program does not take from them."""
    if not ignored:
        return ""
    parts = []
    for path, names in ignored.items():
        shown = ", ".join(printable_name(name) for name in names[:8])
        # a hostile file may hold thousands
        shown += f" and {len(names) - 8} more" if len(names) > 8 else ""
        parts.append(f"{path} sets {shown}")
    return (f"[config] {'; '.join(parts)}: ignored. "
            "A .env gives only the settings .env.example lists, and "
            "only your shell or the program's own .env, when trusted, "
            "sets SANDBOX, SANDBOX_NETWORK, S08_HISTORY or a proxy.")


def printable_name(name: str) -> str:
    """A variable's name as a line may show it: a folder's .env may hold escape sequences."""
    return name if name.isprintable() and len(name) <= 60 else repr(name[:60])


def keep_keys_home(found: dict, shell: dict, own: Path | None) -> str:
    """A .env other than the program's own (the working folder's: often a repository just
    cloned) may name the endpoint only for a key that file gives too. A base URL it sets is
    dropped when the key in use comes from elsewhere (the shell, the program's .env), so
    your key never goes to a host a repository chose. Returns a note ("" when none)."""
    for path, values in found.items():
        url = values.get("ANTHROPIC_BASE_URL")
        if same_file(path, own) or not url or os.environ.get("ANTHROPIC_BASE_URL") != url \
                or shell.get("ANTHROPIC_BASE_URL", "").strip():
            continue
        in_use = [name for name in CREDENTIALS if os.environ.get(name, "").strip()]
        if all(values.get(name) == os.environ[name] and not shell.get(name, "").strip()
               for name in in_use):
            continue  # its own key, to its own endpoint
        del os.environ["ANTHROPIC_BASE_URL"]
        mine = next((v.get("ANTHROPIC_BASE_URL") for p, v in found.items() if same_file(p, own)),
                    None)
        if mine:  # the program's own .env named one too: the folder's came first, and hid it
            os.environ["ANTHROPIC_BASE_URL"] = mine
        return (f"[config] {path} sets ANTHROPIC_BASE_URL but not the key in use, "
                "so it was ignored: your key "
                "is not sent to a host that file chose. "
                + ("The program's own .env names the endpoint used." if mine
                   else "Set the URL in your shell or in the program's own .env."))
    return ""


def dotenv_text(path: Path, data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise StartupError(f"{path} is saved as UTF-16. "
                           "Save it as UTF-8 (in your editor: Save with Encoding, UTF-8).")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise StartupError(f"{path} is not UTF-8 text "
                           f"(line {line} holds the byte {data[err.start]:#04x}). Save it as UTF-8 "
                           "(in your editor: Save with Encoding, UTF-8).") from None


def tidy_settings() -> list:
    """Strip the spaces and line breaks around the settings people paste (a key copied with
    its newline is refused by the HTTP library, and was then blamed on the network). The
    environment is corrected in place; returns one note for each setting tidied."""
    notes = []
    for name in TRIMMED:
        value = os.environ.get(name)
        if value is not None and value != value.strip():
            os.environ[name] = value.strip()
            what = "a line break" if value.strip(" \t") != value.strip() else "a space"
            notes.append(f"[config] {name} has {what} before or after it, "
                         "which the program leaves out; take it out of .env or your shell.")
    return notes


def check_credentials() -> None:
    """A key or token with a character no key has (a space, a line break, a letter outside
    ASCII) cannot go in an HTTP header: say which setting, before any request."""
    for name in CREDENTIALS:
        value = os.environ.get(name, "")
        bad = next((k for k, char in enumerate(value)
                    if not (char.isascii() and char.isprintable()) or char.isspace()),
                   None)
        if bad is not None:
            char = "a space" if value[bad] == " " else repr(value[bad])
            raise StartupError(f"{name} has a character no key has "
                               f"({char} at position {bad + 1} of {len(value)}). "
                               "Copy the key again into .env or your shell.")


def base_url_setting() -> str:
    """Check ANTHROPIC_BASE_URL; a trailing /v1 (the SDK adds its own, so requests would go
    to /v1/v1/messages) is taken off, in the environment, and a note returned."""
    url = os.environ.get("ANTHROPIC_BASE_URL", "")
    if not url:
        return ""
    shown = re.sub(r"//[^/@\s]*@", "//", url)  # a proxy's user:password never goes on screen
    fix = ("Set it to the endpoint's address, such as https://api.anthropic.com, "
           "or remove it to use Anthropic's API.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as err:
        raise StartupError(f"ANTHROPIC_BASE_URL={shown!r} is not a usable URL ({err}). "
                           f"{fix}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StartupError(f"ANTHROPIC_BASE_URL={shown!r} is not a usable URL "
                           f"(it must start with https:// or http:// and name a host). {fix}")
    try:
        httpx2.URL(url)  # the HTTP library's own parser is stricter than urlsplit
    except httpx2.InvalidURL as err:
        raise StartupError(f"ANTHROPIC_BASE_URL={shown!r} is not a usable URL ({err}). "
                           f"{fix}") from None
    trimmed = re.sub(r"/v1(/messages)?/*$", "", url)
    if trimmed == url:
        return ""
    os.environ["ANTHROPIC_BASE_URL"] = trimmed
    return (f"[config] ANTHROPIC_BASE_URL ends in {url[len(trimmed):]}, "
            "which the program adds itself; "
            f"using {shown[:len(shown) - len(url) + len(trimmed)]} "
            "(take the ending off in .env or your shell).")


def listed_models(client) -> tuple | None:
    """(the model ids the endpoint lists, whether the list is Anthropic's Models API), or
    None when it lists none. An OpenAI-shaped list (vLLM, LiteLLM, OpenRouter, llama.cpp)
    may leave out models the endpoint serves anyway."""
    try:
        page = client.with_options(max_retries=0, timeout=10).get(
            "/v1/models", cast_to=object, options={"params": {"limit": 1000}})
    except anthropic.APIError:
        return None
    data = page.get("data") if isinstance(page, dict) else None
    if not isinstance(data, list) or not data:
        return None
    entries = [entry for entry in data
               if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
    return ([entry["id"] for entry in entries],
            all(entry.get("type") == "model" for entry in entries))


def closest(model: str, ids: list) -> list:
    """The ids most like the one given, closest first."""
    similarity = {i: difflib.SequenceMatcher(None, model.lower(), i.lower()).ratio() for i in ids}
    return sorted(ids, key=similarity.get, reverse=True)[:CLOSEST_MODELS]


def check_model(client, model: str) -> str:
    """Called when the Models API answered 404 for the model. When the endpoint's list is
    Anthropic's, that 404 is the truth: a StartupError naming MODEL_ID and the closest ids.
    When its list is another shape, and lacks the model, a note (some serve more than they
    list); with no list at all (most compatible endpoints), nothing."""
    found = listed_models(client)
    if not found or model in found[0]:
        return ""
    ids, anthropic_list = found
    suggestions = ", ".join(closest(model, ids))
    if anthropic_list:
        raise StartupError(f"MODEL_ID={model!r}: the endpoint has no such model. "
                           f"The closest of the {len(ids)} it lists: {suggestions}. "
                           "Set MODEL_ID in .env or your shell.")
    return (f"[endpoint] MODEL_ID={model!r} is not among the {len(ids)} models the endpoint lists "
            f"(closest: {suggestions}). Some endpoints serve more than they list; "
            "if the first message fails with 404, fix MODEL_ID.")


def trusted_own(own: Path, workdir: Path) -> tuple:
    """(the program's own .env, to be trusted as such, or None; whether it is read at all; a
    note). It is read like a folder's .env (no SANDBOX, proxy or other host for your key) when
    a command could have written what lies there: where it is a link inside the working
    folder, or is reached through one (the sandbox pins a file or folder, never a link: a
    command can put another file in the link's place), and where a command changed it since
    (next_start.py). It is not read at all while it has another name (a hard link): the
    sandbox hides it at one path only, so a command could read your key through the other."""
    work = os.path.realpath(workdir)
    try:
        info = os.stat(own)
    except OSError:
        info = None  # missing, or unreadable: read_dotenv says so
    # a folder's count is not names
    names = info.st_nlink if info and stat.S_ISREG(info.st_mode) else 1
    if names > 1:
        return None, False, (f"[config] the program's own .env ({own}) has {names} names "
                             "(hard links): a command could read your key through another, "
                             "so it is not read. Make it a file of its own "
                             f"(cp {own} {own}.new && mv {own}.new {own}).")
    links = passes_through(own, work)
    changed = changed_by_command(own)
    if not links and not changed:
        return own, True, ""
    read_as = ("it is read like a cloned repository's .env: "
               "SANDBOX, SANDBOX_NETWORK, S08_HISTORY and proxies are not taken from it, "
               "and ANTHROPIC_BASE_URL only with a key from the same file")
    if changed:
        return None, True, (f"[config] the program's own .env ({own}) is not trusted: {changed}. "
                            "Until you check it and save it again "
                            f"(touch {own} will do), {read_as}.")
    what = "a link" if links == [str(own)] else f"reached through a link ({links[0]})"
    return None, True, (f"[config] the program's own .env ({own}) is {what} "
                        "inside the working folder: a command "
                        f"could put another file in its place, so {read_as}. "
                        "Make it a file, or start the program in another folder.")


def open_session(agent, resume: Path | None) -> list:
    """The agent's session log, new or the one given continued (session_log.py);
    its history."""
    setup = LogSetup(agent.workdir, agent.settings, agent.endpoint, agent.secrets, agent.say)
    agent.log, history = open_session_log(setup, resume, agent.state.counter)
    return history


def build_system_prompt(workdir: Path, skills: dict, instructions: str = "") -> str:
    """Sent whole with every request: the project's instructions (AGENTS.md) survive every
    compaction. The workspace's path, a skill's folder or its text may hold bytes that are
    not UTF-8 (a folder named caf\\xe9): they are sent as U+FFFD (well_formed)."""
    listed = "\n".join(f"- {name}: {s['description']}" for name, s in skills.items()) or "(none)"
    text = (f"You are a coding agent working in {workdir}. Use the tools to inspect and change "
            "files and to run commands; keep going until the user's request is done, then answer "
            "briefly.\n"
            "Long conversations are compacted: old tool results become pointers to files under "
            f"{TOOL_RESULTS_DIR}/ and old messages are summarized. Read those files again when you "
            "need the details. Call compact yourself when you finish a phase of work.\n"
            f"Skills (load one with load_skill before using it):\n{listed}"
            + (instructions and f"\n\n{instructions}"))
    return well_formed(text)
