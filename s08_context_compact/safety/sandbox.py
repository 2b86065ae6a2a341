"""Commands confined by the operating system. On Linux with bubblewrap (bwrap), every
bash command runs with the whole file system read-only except the workspace; the
program's own folders read-only inside it; a private /tmp, /proc and /dev; the places
that hold credentials hidden; and a PID namespace of its own, so every process the
command starts ends with it. The permission check reads a command's text; this confines
what the command, and any script it runs, can do.

Machinery the chapter does not need: find_sandbox tries bubblewrap once (or says why
there is none), Sandbox.start gives the argument list that command_runner.py runs each
command with, and the permission check need not ask about writes the sandbox refuses
anyway. It is not a virtual machine: what is outside the workspace can still be read,
minus the hidden places, and the network is on unless SANDBOX_NETWORK=off.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from ..basics import (OWN_DOTENV, OWN_FOLDERS, SECRET_NAME, history_file, own_folder,
                      program_places, state_folder)
from .next_start import Watch, contains, passes_through

# Under $HOME: where keys, tokens and passwords live, and the shells' histories (a typed
# password, an exported token). Each is replaced by an empty folder or file inside.
CREDENTIALS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config/gcloud",
               ".config/gh", ".config/git/credentials", ".netrc", ".git-credentials", ".npmrc",
               ".pypirc", ".cargo/credentials", ".cargo/credentials.toml", ".gem/credentials",
               ".m2/settings.xml", ".terraform.d", ".password-store", ".pgpass", ".vault-token",
               ".s3cfg", ".boto", ".oci", ".config/op", ".config/doctl", ".config/hub",
               ".config/rclone", ".local/share/keyrings", ".mozilla", ".config/google-chrome",
               ".config/chromium",
               ".bash_history", ".zsh_history", ".local/share/fish/fish_history", ".python_history",
               ".node_repl_history", ".psql_history", ".mysql_history", ".lesshst")
# Settings that move those places elsewhere (a list, for KUBECONFIG), and what lies in them.
# What they name is hidden only inside $HOME: a setting could otherwise hide /usr, bubblewrap
# would no longer start, and the sandbox would be gone.
MOVED_BY = {"GNUPGHOME": ("",), "DOCKER_CONFIG": ("",), "CLOUDSDK_CONFIG": ("",),
            "AZURE_CONFIG_DIR": ("",), "PASSWORD_STORE_DIR": ("",),
            "AWS_SHARED_CREDENTIALS_FILE": ("",), "KUBECONFIG": ("",),
            "CARGO_HOME": ("credentials", "credentials.toml"),
            "XDG_CONFIG_HOME": ("gcloud", "gh", "git/credentials", "op", "doctl", "hub", "rclone")}
# Tools cache under $HOME, which is read-only: these settings send their caches to the
# command's private /tmp, thrown away with it.
CACHES = {"XDG_CACHE_HOME": "/tmp/.cache", "PIP_CACHE_DIR": "/tmp/.cache/pip",
          "npm_config_cache": "/tmp/.cache/npm", "YARN_CACHE_FOLDER": "/tmp/.cache/yarn",
          "GOCACHE": "/tmp/.cache/go-build", "GOMODCACHE": "/tmp/.cache/go-mod", "TMPDIR": "/tmp"}
# Made afresh for each command: nothing of the real ones shows, and a write there stays
# the command's own.
PRIVATE = ("/tmp", "/dev", "/proc")
# Sockets that act outside the sandbox for whoever connects (ssh-agent, gpg-agent, the session's
# D-Bus, Docker): hidden like credentials, and their variables not passed on.
AGENTS = ("/run/user", "/run/docker.sock", "/var/run/docker.sock", "/run/podman")
AGENT_VARIABLES = ("SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR",
                   "DOCKER_HOST")
# What a program started outside the sandbox (bubblewrap itself) gets of the environment:
# these names and nothing else. LD_PRELOAD, PYTHONPATH, BASH_ENV, GIT_* or a proxy would
# act there before any confinement; the command inside gets its own environment from bwrap.
OUTSIDE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM")
OUTSIDE_ENV_PREFIXES = ("LC_",)
PROBE_SECONDS = 10
INSTALL = "apt or dnf install bubblewrap"
# What a refused command prints, in the wordings programs use (EROFS by name, as Node and npm
# say it; the C library's message in the languages readers set), and what to tell the model.
READ_ONLY_SIGNS = re.compile(r"read-only file system|\bEROFS\b|Errno 30\b|"
                             r"只读文件系统|唯讀檔案系統|"
                             r"読み込み専用ファイルシステム|"
                             r"읽기 전용 파일 시스템|Schreibgeschütztes Dateisystem|"
                             r"en lecture seule|de sólo lectura|только для чтения",
                             re.IGNORECASE)
READ_ONLY_NOTE = ("the file system is read-only outside the workspace, and in its "
                  f"{', '.join(f + '/' for f in OWN_FOLDERS)} and the program's own code "
                  "(sandbox); write inside the workspace, or in /tmp, which is private to this "
                  "command")


@dataclass(frozen=True)
class Sandbox:
    """How bash commands run: inside bubblewrap (on), or as they are, with the reason."""
    on: bool = False
    network: bool = True
    why_not: str = ""                  # when off: why, said once at start-up
    own_env: Path | None = None        # the program's own .env: hidden from every command
    bwrap: str = "bwrap"               # its real path, found once outside the workspace
    program: tuple = ()                # program_places(): read-only even inside the workspace
    # what the next start reads that a command could still change
    watch: Watch | None = None
    withheld: tuple = ()               # the program's settings, never passed to a command

    @property
    def wrappers(self) -> int:
        """Processes between the one started and the command's shell: bwrap's own two."""
        return 2 if self.on else 0

    def describe(self) -> str:
        if not self.on:
            return f"off: {self.why_not}"
        network = "on" if self.network else "off"
        return f"bubblewrap: read-only outside the workspace, network {network}"

    def tools(self, tools: dict) -> dict:
        """The tools (name -> Tool), each that runs commands telling the model what the sandbox
        changes."""
        if not self.on:
            return tools
        note = (" Commands run in a sandbox: the file system is read-only outside the workspace, "
                "/tmp is private to each command, and every process a command starts ends with "
                "it (start a server and its client in one command).")
        if not self.network:
            note += " There is no network."
        return {name: replace(tool, description=tool.description + note) if tool.runs else tool
                for name, tool in tools.items()}

    def start(self, script: str, workdir: Path, env: dict) -> "Confined":
        """How to start script with bash in workdir, in what it may have of the environment env:
        confined, when on."""
        if not self.on:
            return Confined(["bash", "-c", script], self.environment(env))
        work = os.path.realpath(workdir)
        inside = self.environment(env)
        # read by bwrap: the environment stays off its command line
        settings = tempfile.TemporaryFile()
        settings.write(b"\0".join(os.fsencode(part) for name, value in inside.items()
                                   for part in ("--setenv", name, value)) + b"\0")
        settings.seek(0)
        mounts, blanks = self.mounts(work)
        argv = [self.bwrap, "--args", str(settings.fileno()), *mounts]
        argv += ["--unshare-pid", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if not self.network:
            argv.append("--unshare-net")
        argv += ["--chdir", work, "--", "bash", "-c", script]
        return Confined(argv, outside_environment(inside), settings, blanks)

    def mounts(self, work: str) -> tuple:
        """bubblewrap's mounts, in order (a later one lies over an earlier one), and the
        descriptors of /dev/null that its empty files are made from."""
        argv = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                # a new /proc lets root write kernel settings (a core_pattern runs as root outside)
                "--ro-bind", "/proc/sys", "/proc/sys",
                "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
        for python in {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}:
            # the program's own Python (a virtual environment in /tmp) stays usable
            if contains("/tmp", python):
                argv += ["--ro-bind", python, python]
        argv += ["--bind", work, work]
        hidden = self.hidden(work)
        program = self.program_inside(work)
        kept = self.kept_in_place(work)
        # first: a bind lies over what was mounted inside. A folder bound onto itself is a mount
        # point, which no command can rename or remove
        for folder in pinned(work, hidden + program) + kept:
            argv += ["--bind", folder, folder]
        # the session log and saved outputs: readable, never rewritten (nor made)
        for own in OWN_FOLDERS:
            try:
                own_folder(Path(work), own)
            except OSError:  # a link or a file planted there: the program writes nothing through it
                continue
            path = os.path.join(work, own)
            argv += ["--ro-bind", path, path]
        for place in program:  # what the next start runs: never changed by a command
            argv += ["--ro-bind", place, place]
        blanks = []
        for place in hidden:
            if os.path.isdir(place):
                argv += ["--tmpfs", place, "--remount-ro", place]
            else:
                # an empty file bubblewrap makes from what it reads (nothing):
                # no file of ours to swap
                blanks.append(os.open(os.devnull, os.O_RDONLY))
                argv += ["--ro-bind-data", str(blanks[-1]), place]
        return argv, blanks

    def program_inside(self, work: str) -> list:
        """The program's places that lie strictly inside the workspace (elsewhere all is
        read-only already). One that is missing there (a user site not made yet) is made
        first, so that a command cannot make it and fill it."""
        places = []
        for place in self.program:
            if place == work or not contains(work, place):
                continue  # outside, or the workspace itself (start-up said so)
            try:
                os.makedirs(place, exist_ok=True) if not os.path.lexists(place) else None
            except OSError:
                continue
            places.append(place)
        return places

    def hidden(self, work: str) -> list:
        """The places hidden from a command in work, as real paths. A project's .env stays (its
        code may need it); the program's own is hidden wherever it lies: no command needs the
        program's key, and none may write the settings the next start reads. What the next
        start reads that is not there yet inside the workspace (the program's .env, the history
        file, the state folder) is made first, so that no command makes it."""
        home = Path.home()
        history = made_first(history_file(), work)
        files = [history, os.getenv("HISTFILE")]  # named by settings: files only, never /usr
        places = [home / name for name in CREDENTIALS]
        places += [made_first(state_folder(), work, folder=True), *AGENTS, runtime_folder()]
        places += [f for f in files if f and os.path.isfile(f)] + moved_credentials()
        found = {own_env_place(self.own_env, work)} - {None}
        for place in filter(None, places):
            real = os.path.realpath(place)
            private = any(contains(p, real) for p in PRIVATE) and not contains(work, real)
            if not os.path.lexists(real) or contains(real, work) or private:
                # missing; holding the workspace; or in a private place the command sees afresh
                continue
            found.add(real)
        # A place inside another is hidden with it: bubblewrap could not make its mount point
        # in the empty, read-only folder over the outer one, and would not start at all.
        return sorted(p for p in found if not any(q != p and contains(q, p) for q in found))

    def kept_in_place(self, work: str) -> list:
        """The program's own .env where it is a folder in the workspace (an old virtual
        environment): nothing to hide, but bound onto itself, so that no command removes it
        and writes a file of settings in its place."""
        real = os.path.realpath(self.own_env) if self.own_env else None
        inside = real and real != work and contains(work, real)
        return [real] if inside and os.path.isdir(real) else []

    def watched(self, work: str) -> tuple:
        """What the next start reads that a command in work could still change: the program's
        own .env and the history file, where their path lies in the workspace or leads
        through it (a link cannot be pinned)."""
        places = [p for p in (self.own_env, history_file()) if p]
        return tuple(str(p) for p in places
                     if contains(work, os.path.realpath(p)) or contains(work, os.path.abspath(p))
                     or passes_through(p, work))

    def environment(self, env: dict) -> dict:
        """The command's environment: no secret (a name with KEY, TOKEN, SECRET or PASSWORD in
        it: `env` must not be one call away from the key) and none of the program's own
        settings; inside the sandbox, without the agents' sockets either, caches in its /tmp."""
        kept = {k: v for k, v in env.items()
                if not SECRET_NAME.search(k) and k not in self.withheld}
        if not self.on:
            return kept
        return {**{k: v for k, v in kept.items() if k not in AGENT_VARIABLES}, **CACHES}

    def explain(self, output: str, command: str, workdir: Path) -> str:
        """A line telling the model what the sandbox refused, if the output shows it did."""
        if not self.on:
            return ""
        notes = [READ_ONLY_NOTE] if READ_ONLY_SIGNS.search(output) else []
        home = str(Path.home())
        named = [place for place in self.hidden(os.path.realpath(workdir))
                 if place in output or place in command or place.replace(home, "~", 1) in command]
        if named:
            shown = ", ".join(p.replace(home, "~", 1) for p in named[:3])
            verb = "is" if len(named) == 1 else "are"
            notes.append(f"{shown} {verb} hidden from commands (sandbox): "
                         "credentials, histories and agents' sockets stay out of reach")
        return "".join(f"\n[{note}]" for note in notes)

    def look_again(self) -> str:
        """A line for the model and for you when what just ran (a command, a tool call, /undo)
        changed what the next start reads ("" when it did not); the change is recorded for
        that start."""
        changed = self.watch.look_again() if self.watch else []
        if not changed:
            return ""
        return (f"\n[{', '.join(changed)} changed, which the program reads when it starts: "
                "the next start will not trust it until you check it and save it again]")


def pinned(work: str, places: list) -> list:
    """The folders between the workspace and each place inside it, shallowest first. Each is
    bound onto itself, writable as before, so that it is a mount point, which no command can
    rename or remove: a read-only place could otherwise be moved away whole (mv lcc lcc2) and
    a changed copy put where it was, for the next start to run."""
    folders = set()
    for place in places:
        folder = os.path.dirname(place)
        while folder != work and contains(work, folder):
            folders.add(folder)
            folder = os.path.dirname(folder)
    return sorted(folders, key=lambda folder: folder.count("/"))


@dataclass
class Confined:
    """A command ready to start: its argv and environment, the file that bubblewrap reads the
    command's own environment from, and the empty sources of its hidden files (passed on as
    open descriptors, closed once started)."""
    argv: list
    env: dict
    settings: BinaryIO | None = None  # the file bubblewrap reads the environment from
    blanks: list = field(default_factory=list)

    @property
    def fds(self) -> tuple:
        return ((self.settings.fileno(),) if self.settings else ()) + tuple(self.blanks)

    def close(self) -> None:
        if self.settings:
            self.settings.close()
        for fd in self.blanks:
            os.close(fd)
        self.blanks = []


def outside_environment(env: dict) -> dict:
    """What a program the sandbox does not confine may see of env: OUTSIDE_ENV only."""
    return {name: value for name, value in env.items()
            if name in OUTSIDE_ENV or name.startswith(OUTSIDE_ENV_PREFIXES)}


def own_env_place(own_env: Path | None, work: str) -> str | None:
    """The program's own .env, to hide, where it is (or will be) a file; None for a folder."""
    if own_env is None:
        return None
    real = made_first(own_env, work)
    if real is None or os.path.isdir(real) or contains(real, work) or not os.path.lexists(real):
        # a folder named .env (a virtual environment) is not settings: kept_in_place pins it
        return None
    return real


def made_first(place: Path | None, work: str, folder: bool = False) -> str | None:
    """place's real path; made empty (readable by you only) where it is missing inside the
    workspace, so that no command makes it first for the next start to read: a file of
    settings, a link to follow, a pipe that would block. None where there is nothing to hide."""
    if place is None:
        return None
    real = os.path.realpath(place)
    can_make = folder or os.path.isdir(os.path.dirname(real))
    if os.path.lexists(real) or not contains(work, real) or not can_make:
        return real  # there already; or outside, where no command makes anything
    try:
        if folder:
            os.makedirs(real, 0o700)
        else:
            os.close(os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError:
        return None
    return real


def trusted_program(name: str, work: str) -> str | None:
    """A program's real path, found on PATH outside the workspace, and reached through no link
    inside it: a command could put a bwrap of its own in a folder of PATH that the workspace
    holds (./bin, node_modules/.bin), or point a link there at one."""
    folders = [folder for folder in os.getenv("PATH", "").split(os.pathsep)
               if os.path.isabs(folder) and not contains(work, os.path.realpath(folder))]
    for folder in folders:
        found = shutil.which(name, path=folder)
        if not found:
            continue
        if not contains(work, os.path.realpath(found)) and not passes_through(found, work):
            return os.path.realpath(found)
    return None


def moved_credentials() -> list:
    """The credential places settings moved, where they lie strictly inside $HOME."""
    home = os.path.realpath(Path.home())
    named = [(value, inside) for name, insides in MOVED_BY.items()
             for value in os.getenv(name, "").split(os.pathsep)
             for inside in insides if os.path.isabs(value)]
    places = [os.path.realpath(os.path.join(value, inside)) for value, inside in named]
    return [place for place in places if place != home and contains(home, place)]


def runtime_folder() -> str | None:
    """$XDG_RUNTIME_DIR, if it is what the name promises: yours, and no one else's (mode 0700);
    never a system folder a setting names."""
    folder = os.getenv("XDG_RUNTIME_DIR")
    try:
        info = os.stat(folder) if folder else None
    except OSError:
        return None
    yours_only = info and info.st_uid == os.getuid() and not info.st_mode & 0o077
    return folder if yours_only else None


def find_sandbox(wanted: bool = True, network: bool = True, own_env: Path | None = OWN_DOTENV,
                 workdir: Path | None = None, withheld: tuple = ()) -> Sandbox:
    """The sandbox this system allows, tried once with a command that does nothing; or why
    there is none. withheld: the names of the program's settings, which no command is given."""
    if not wanted:
        return Sandbox(withheld=withheld, why_not="SANDBOX=off")
    if not sys.platform.startswith("linux"):
        why_not = f"bubblewrap runs on Linux only, not {sys.platform}"
        return Sandbox(withheld=withheld, why_not=why_not)
    work = os.path.realpath(workdir or Path.cwd())
    bwrap = trusted_program("bwrap", work)
    if not bwrap:
        named = shutil.which("bwrap")
        if named:
            why_not = (f"the bwrap on PATH ({named}) lies in or leads into the working folder, "
                       f"where a command could replace it; install bubblewrap ({INSTALL}) or put "
                       "it first on PATH")
        else:
            why_not = f"bwrap is not installed ({INSTALL})"
        return Sandbox(withheld=withheld, why_not=why_not)
    sandbox = Sandbox(on=True, network=network, own_env=own_env, bwrap=bwrap,
                      program=program_places(), withheld=withheld)
    # in a folder of its own: trying makes the program's folders in the workspace it is given
    try:
        with tempfile.TemporaryDirectory(prefix="s08-probe-") as folder:
            probe = sandbox.start("true", Path(folder), outside_environment(dict(os.environ)))
            try:
                tried = subprocess.run(probe.argv, env=probe.env, pass_fds=probe.fds,
                                       stdin=subprocess.DEVNULL, capture_output=True,
                                       timeout=PROBE_SECONDS, text=True, errors="replace")
            finally:
                probe.close()
    except (OSError, subprocess.TimeoutExpired) as err:
        return Sandbox(withheld=withheld, why_not=f"bwrap could not start: {err}")
    if tried.returncode != 0:
        said = (tried.stderr.strip().splitlines() or ["no reason given"])[-1]
        return Sandbox(withheld=withheld, why_not=f"bwrap could not start: {said}")
    if workdir is None:  # asked what this system allows, not for a session's commands
        return sandbox
    # what is missing is made now: the watch starts from what the program made
    sandbox.hidden(work)
    return replace(sandbox, watch=Watch(sandbox.watched(work)).begin())


def start_up_line(sandbox: Sandbox, workdir: Path, set_by_shell: bool = True) -> str:
    """What start-up says when commands are not confined, or confined to a folder that holds
    the home folder ("" when all is well, or your shell turned the sandbox off)."""
    work, home = os.path.realpath(workdir), os.path.realpath(Path.home())
    program = next((place for place in sandbox.program if contains(place, work)), None)
    if sandbox.on and program:
        return (f"[sandbox] the working folder {work} is inside the program's own {program}: "
                "commands may change it, and the next start would run what they changed "
                "unconfined. Start the program in a project's folder.")
    if sandbox.on and contains(work, home):
        return (f"[sandbox] the working folder {work} holds your home folder: commands may change "
                "anything in it but the hidden places. Start the program in a project's folder "
                "to keep them to that folder.")
    if sandbox.on and sandbox.watch and sandbox.watch.problem:
        return (f"[sandbox] nothing can be written down in {sandbox.watch.problem}: the next start "
                f"could not tell whether a command changed {', '.join(sandbox.watch.places)}. "
                "Make that folder writable.")
    if sandbox.on or sandbox.why_not == "SANDBOX=off" and set_by_shell:
        return ""
    # from the program's own .env: say so, in case you did not write it
    if sandbox.why_not == "SANDBOX=off":
        return "[sandbox] off: SANDBOX=off in the program's own .env; commands run unconfined."
    return f"[sandbox] off: {sandbox.why_not}; commands run unconfined."
