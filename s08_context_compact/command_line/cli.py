"""The command line around the agent: arguments, configuration from the environment
and .env files, the checks made before the first prompt, and a clean exit on Ctrl-C or a
closed pipe.

Machinery the chapter does not need. configure() turns the arguments and the settings into
a Config, enough to build the agent (or an exit code), and builds nothing itself; run() runs
the program so that SIGTERM and SIGHUP end it cleanly (Stop). startup.py, beside it, holds
the checks; repl.py reads the prompts once the agent is built.
"""

import argparse
import importlib.util
import os
import re
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info < (3, 10):  # before the modules below, which a Python this old cannot run
    sys.exit(f"This program needs Python 3.10 or newer; this is Python {sys.version.split()[0]}. "
             "Make the virtual environment with a newer python3 "
             "(README.md, section \"Set up\").")

from ..endpoint import (API_RETRIES, CONNECT_TIMEOUT, DEFAULT_WINDOW_SOURCE, IDLE_TIMEOUT,
                        MAX_CONTEXT_WINDOW, MIN_CONTEXT_WINDOW, Endpoint, discover_endpoint,
                        make_client)
from ..basics import (OWN_DOTENV, PROGRAM, printable, project_instructions, Redactor,
                      secret_values, WarningsOnce, well_formed)
from ..safety import Sandbox, find_sandbox, start_up_line
from ..session import SessionRefused, find_session, list_sessions, logged_endpoint
from .session_picture import report_line
from .startup import (PROXIES, SETTINGS, StartupError, unread_dotenv, base_url_setting,
                      check_credentials, check_model, keep_keys_home, load_dotenv_files,
                      same_file, tidy_settings, trusted_own)
from .repl import banner


SETUP_HELP = """{problem}
Copy .env.example to .env and fill in MODEL_ID and either ANTHROPIC_API_KEY or
ANTHROPIC_AUTH_TOKEN (a token sent as "Authorization: Bearer", as proxies such
as OpenRouter want), plus ANTHROPIC_BASE_URL for an Anthropic-compatible
endpoint; or export them in your shell. See README.md, section "Set up"."""

DOTENV_HELP = """{problem}
{path} does not set {them}. Add to it:
{lines}
or export {them} in your shell. .env.example has every setting, with the base URL
and a model id for each compatible provider (README.md, section "Set up")."""

MISSING_LINES = {
    "key": "    ANTHROPIC_API_KEY=<your key>   (or ANTHROPIC_AUTH_TOKEN=<token> for a proxy)",
    "model": "    MODEL_ID=claude-sonnet-5-5     (or the model id your endpoint uses)"}


def dotenv_paths() -> list:
    return [Path.cwd() / ".env", OWN_DOTENV]


def missing_settings(dotenv_found: dict) -> str:
    """What to tell a person when the key or the model is not set ("" when both are)."""
    has_key = os.getenv("ANTHROPIC_API_KEY") or os.getenv("ANTHROPIC_AUTH_TOKEN")
    missing = ([] if has_key else ["key"]) + ([] if os.getenv("MODEL_ID") else ["model"])
    if not missing:
        return ""
    problem = " ".join({"key": "Neither ANTHROPIC_API_KEY nor ANTHROPIC_AUTH_TOKEN is set.",
                        "model": "MODEL_ID is not set."}[m] for m in missing)
    if not dotenv_found:
        return SETUP_HELP.format(problem=problem)
    return DOTENV_HELP.format(problem=problem, path=next(iter(dotenv_found)),
                              them="them" if missing[1:] else "it",
                              lines="\n".join(MISSING_LINES[m] for m in missing))


# a setting's value quoted in an error: a pasted page stays one line
SHOWN_VALUE_CHARS = 40
# A number in a setting: plain digits with a decimal point at most. float() would take inf,
# nan, 1e999, 1_000 and full-width digits, and int() 4,000 digits of a window too big to use.
DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{0,12})?|\.[0-9]{1,12}")
# a timeout under a second fails every call; over an hour is no timeout
MIN_SECONDS, MAX_SECONDS = 1, 3600
MAX_RETRIES = 10                    # API_RETRIES: more only makes a dead endpoint slower to say so


def shown_value(name: str, value: str) -> str:
    """NAME='value' for an error line, a value too long for one line cut short."""
    cut = value if len(value) <= SHOWN_VALUE_CHARS else value[:SHOWN_VALUE_CHARS] + "…"
    return f"{name}={cut!r}"


def decimal(text: str) -> float | None:
    """The number a setting holds, written as plain digits (120, 0.7, .5); None otherwise."""
    return float(text) if DECIMAL.fullmatch(text) else None


def seconds_setting(name: str, default: float) -> float:
    value = os.getenv(name, "").strip()
    seconds = decimal(value) if value else default
    if seconds is None or not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(f"{shown_value(name, value)} must be a number of seconds "
                         f"between {MIN_SECONDS} and {MAX_SECONDS}, such as 120.")
    return seconds


def settings_in_utf8() -> None:
    """A setting whose value holds bytes that are not UTF-8 (a shell in another encoding, a
    script's stray byte) cannot go into a request, a header or a URL: name it, before any is
    sent."""
    for name in SETTINGS:
        value = os.environ.get(name, "")
        if well_formed(value) != value:  # where: the value may be a key, never shown
            at = next(k for k, char in enumerate(value) if well_formed(char) != char)
            raise ValueError(f"{name} holds a byte that is not UTF-8 "
                             f"(character {at + 1} of {len(value)}); type the value again.")


def window_setting() -> int | None:
    """CONTEXT_WINDOW, in tokens; None when it is not set."""
    value = os.getenv("CONTEXT_WINDOW", "").strip()
    if not value:
        return None
    if (not re.fullmatch(r"[0-9]{1,12}", value)
            or not MIN_CONTEXT_WINDOW <= int(value) <= MAX_CONTEXT_WINDOW):
        raise ValueError(f"{shown_value('CONTEXT_WINDOW', value)} "
                         "must be a whole number of tokens between "
                         f"{MIN_CONTEXT_WINDOW} and {MAX_CONTEXT_WINDOW}, such as 200000.")
    return int(value)


def retries_setting() -> int:
    """API_RETRIES: how often a call that may pass on its own is sent again."""
    value = os.getenv("API_RETRIES", "").strip()
    if not value:
        return API_RETRIES
    if not re.fullmatch(r"[0-9]{1,2}", value) or not 0 <= int(value) <= MAX_RETRIES:
        raise ValueError(f"{shown_value('API_RETRIES', value)} must be a whole number of "
                         f"retries between 0 and {MAX_RETRIES}, such as {API_RETRIES}.")
    return int(value)


def ttl_setting() -> str:
    ttl = os.getenv("CACHE_TTL", "5m").strip() or "5m"
    if ttl not in ("5m", "1h"):  # the prompt cache lives five minutes, or an hour
        raise ValueError(f"{shown_value('CACHE_TTL', ttl)} must be 5m or 1h.")
    return ttl


def share(text: str) -> float:
    """A share written 0.8 or 80%; -1 when it is neither."""
    number = decimal(text.removesuffix("%"))
    if number is None:
        return -1
    return number / (100 if text.endswith("%") else 1)


def compaction_settings() -> dict:
    """COMPACT_AT and SUMMARY_AHEAD, as the Settings fields they set (only those set)."""
    found = {}
    if value := os.getenv("COMPACT_AT", "").strip():
        found["compact_at"] = share(value)
        if not 0.1 <= found["compact_at"] <= 1:
            raise ValueError(f"{shown_value('COMPACT_AT', value)} "
                             "must be a share of the context window "
                             "between 0.1 and 1 (for example 0.7, or 70%).")
    if value := os.getenv("SUMMARY_AHEAD", "").strip().lower():
        shares = None if value == "off" else tuple(share(v.strip()) for v in value.split("-"))
        if shares is not None and not (len(shares) == 2 and 0.1 <= shares[0] <= shares[1] <= 1):
            raise ValueError(f"{shown_value('SUMMARY_AHEAD', value)} "
                             "must be off, or the earliest and the latest "
                             "share of the threshold at which a summary starts in the background, "
                             "such as 0.6-0.95.")
        found["summary_ahead"] = shares
    return found


def withheld_settings(shell: dict) -> tuple:
    """The program's settings, which no command is given: its endpoint, its model, its
    proxies (they may carry a password), except a proxy your shell set, which your commands
    use too."""
    return tuple(name for name in SETTINGS
                 if not (name in PROXIES and shell.get(name, "").strip()))


def switch_setting(name: str) -> bool:
    """A setting that is on (the default) or off."""
    value = os.getenv(name, "").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ValueError(f"{shown_value(name, value)} must be on or off.")
    return value == "on"


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        description="s08: a coding agent with context compaction. "
                    "Run it in the folder the agent should work in.",
        epilog="Configuration (environment or .env): MODEL_ID, ANTHROPIC_API_KEY or "
               "ANTHROPIC_AUTH_TOKEN, and optionally ANTHROPIC_BASE_URL, CONTEXT_WINDOW, "
               "API_CONNECT_TIMEOUT, API_IDLE_TIMEOUT, API_RETRIES, CACHE_TTL, COMPACT_AT, "
               "SUMMARY_AHEAD, SANDBOX, SANDBOX_NETWORK, S08_HISTORY. "
               "At the prompt, /help lists the commands. README.md has the rest.")
    parser.add_argument("--resume", nargs="?", const="latest", metavar="ID",
                        help="continue the most recent session in this folder, or session ID")
    parser.add_argument("--list", action="store_true", help="list this folder's sessions and exit")
    parser.add_argument("--report", nargs="?", const="latest", metavar="ID",
                        help="write a picture of the most recent session in this folder "
                        "(or session ID) as an HTML page, say where, and exit")
    parser.add_argument("--demo", action="store_true",
                        help="watch every layer fire, offline: a scripted model, no API key needed")
    parser.add_argument("--no-pause", action="store_true",
                        help="with --demo: do not wait for Enter between steps")
    return parser.parse_args(argv)


INSTALL_HELP = """This Python lacks {missing}, which the program needs:
    {python}
Install them in a virtual environment beside the program:
    cd {root}
    {make_venv}. .venv/bin/activate
    python -m pip install -r requirements.txt
Then run the program with that Python (on Windows: .venv\\Scripts\\activate).
See README.md, section "Set up"."""


def missing_requirements() -> list:
    return [package for package, module in (("anthropic", "anthropic"), ("python-dotenv", "dotenv"))
            if importlib.util.find_spec(module) is None]


@dataclass
class Config:
    """What the command line found: enough for main() to build the agent."""
    demo: bool = False
    pause: bool = False
    model: str = ""
    workdir: Path = field(default_factory=Path.cwd)
    client: object = None  # the SDK's client; naming its type would load the SDK
    endpoint: Endpoint = None
    idle_timeout: float = IDLE_TIMEOUT
    api_retries: int = API_RETRIES
    cache_ttl: str = "5m"
    # COMPACT_AT and SUMMARY_AHEAD, as Settings fields
    compaction: dict = field(default_factory=dict)
    sandbox: Sandbox = field(default_factory=Sandbox)  # how bash commands are confined (SANDBOX)
    resume: Path | None = None
    interactive: bool = False
    secrets: Redactor = field(default_factory=Redactor)
    instructions: str = ""                        # the workspace's AGENTS.md, for the system prompt
    # what start-up tidied or found, said before the first prompt
    notes: list = field(default_factory=list)
    display: dict = field(default_factory=dict)  # the Agent's display fields: a terminal, or not


def configure(argv) -> Config | int:
    """The configuration, or an exit code once --list (or a mistake, explained) has been
    dealt with."""
    args = parse_arguments(argv)
    if (args.demo or not (args.list or args.report)) and (missing := missing_requirements()):
        root = PROGRAM.parent
        make_venv = "" if (root / ".venv").is_dir() else "python3 -m venv .venv && "
        print(INSTALL_HELP.format(python=sys.executable, missing=" and ".join(missing), root=root,
                                  make_venv=make_venv),
              file=sys.stderr)
        return 2
    if args.demo:
        return Config(demo=True, pause=sys.stdin.isatty() and not args.no_pause)
    if args.list:
        columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        print(list_sessions(Path.cwd(), columns))
        return 0
    if args.report:
        try:
            said, address = report_line(find_session(Path.cwd(), args.report))
        except ValueError as err:
            said = f"[report] {err}".replace("start one without --resume", "start one first")
            address = ""
        print(printable(said + ("\n" + address if address else "")),
              file=sys.stdout if address else sys.stderr)
        return 0 if address else 2
    try:
        return configure_session(args)
    except StartupError as err:
        # a setting it cannot start with: one line that names it and the fix
        print(err, file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"{err} Set it in .env or in your shell (README.md, section Configuration).",
              file=sys.stderr)
        return 2


def configure_session(args) -> Config | int:
    """The settings, each checked; the endpoint asked about the model; the workspace's
    instructions for agents read. Raises StartupError (or ValueError) for a mistake."""
    shell = dict(os.environ)
    own_path = dotenv_paths()[-1]
    own, read, untrusted = trusted_own(own_path, Path.cwd())
    paths = [path for path in dotenv_paths() if read or not same_file(path, own_path)]
    dotenv_found, ignored = load_dotenv_files(paths, own=own)
    notes = [untrusted, ignored, keep_keys_home(dotenv_found, shell, own)] + tidy_settings()
    # the SDK's deprecation warnings: once each, wrapped like our own lines
    WarningsOnce(sys.stderr)
    if missing := missing_settings(dotenv_found):
        # what start-up found first: why a .env was not read is often why a setting is missing
        unread = [unread_dotenv(path) for path in dotenv_paths() if path not in dotenv_found]
        print("\n".join(note for note in notes + unread if note) + "\n" + missing, file=sys.stderr)
        return 2
    settings_in_utf8()
    check_credentials()
    notes.append(base_url_setting())
    model, workdir = os.environ["MODEL_ID"], Path.cwd()
    try:
        resume = find_session(workdir, args.resume) if args.resume else None
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    idle = seconds_setting("API_IDLE_TIMEOUT", IDLE_TIMEOUT)
    client = make_client(seconds_setting("API_CONNECT_TIMEOUT", CONNECT_TIMEOUT), idle)
    logged = logged_endpoint(resume, model) if resume else None
    endpoint = discover_endpoint(client, model, logged, configured=window_setting())
    # a 404 just now
    if not endpoint.models_api and (logged or {}).get("models_api", True) is not False:
        notes.append(check_model(client, model))
    ttl = ttl_setting()
    compaction = compaction_settings()
    sandbox = find_sandbox(switch_setting("SANDBOX"), switch_setting("SANDBOX_NETWORK"),
                           own_env=dotenv_paths()[-1],
                           workdir=workdir, withheld=withheld_settings(shell))
    set_by_shell = shell.get("SANDBOX", "").strip().lower() == "off"
    notes.append(start_up_line(sandbox, workdir, set_by_shell=set_by_shell))
    # built once: every form of each
    secrets = Redactor(secret_values(os.environ, tuple(dotenv_found.values())))
    instructions, said = project_instructions(workdir, secrets)
    # line by line; never dies on a character
    sys.stdout.reconfigure(line_buffering=True, errors="replace")
    sys.stdin.reconfigure(errors="replace")  # bytes that are not UTF-8 must not end the session
    terminal = sys.stdout.isatty()
    return Config(model=model, workdir=workdir, client=client, endpoint=endpoint,
                  idle_timeout=idle, api_retries=retries_setting(), cache_ttl=ttl,
                  compaction=compaction, sandbox=sandbox, resume=resume,
                  interactive=sys.stdin.isatty(),
                  secrets=secrets, instructions=instructions,
                  notes=[note for note in notes + said if note],
                  display={"show_status": terminal, "color": terminal and not os.getenv("NO_COLOR"),
                          "fit_width": terminal,
                          "spinner_to": sys.stdout if terminal else None})


def say_what_start_up_found(agent, config) -> None:
    """Before the first prompt: the banner (on a terminal), then the notes start-up made
    and what the endpoint's answer showed."""
    if config.interactive:
        banner(agent)
    for note in config.notes:
        agent.say(note)
    endpoint = agent.endpoint
    if endpoint.startup_problem:
        agent.say(f"[endpoint] {endpoint.startup_problem} "
                  "The first message will fail the same way until this is fixed.", "error")
    if endpoint.window_source == DEFAULT_WINDOW_SOURCE:
        agent.say(f"[window] nothing says how big {endpoint.model}'s window is; "
                  f"assuming {endpoint.window:,} tokens. Set CONTEXT_WINDOW if you know it; "
                  "otherwise the endpoint's first \"too long\" answer will tell.")


# Windows: no SIGHUP
STOP_SIGNALS = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]


class Stop(BaseException):
    """SIGTERM or SIGHUP: leave now, once what is running has been ended. A BaseException,
    like Ctrl-C's KeyboardInterrupt, so no handler of ordinary errors swallows it."""


def stop_on_signal(signum: int, frame) -> None:
    for stop_signal in STOP_SIGNALS:  # a second signal must not interrupt the ending
        signal.signal(stop_signal, signal.SIG_IGN)
    raise Stop(signum)


def run(main) -> int:
    """main(), with the ways out a person (or the system) causes handled quietly. SIGTERM
    and SIGHUP end the running command's processes (safety's run_command does, as the
    exception passes) and exit with 128 + the signal's number, as a shell would report."""
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, stop_on_signal)
    try:
        return main()
    except SessionRefused as err:
        # --resume of a session open elsewhere, or changed outside the program
        print(printable(str(err)), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C before the prompt is up (or at the demo's pause): leave quietly
        print(file=sys.stderr)  # ...and let the shell's prompt start on a line of its own
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): nothing left to say, and no one to say it to;
        # so the exit flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell command would
    except Stop as stop:
        signum = stop.args[0]
        ended = " ".join(getattr(stop, "__notes__", []))
        try:  # after SIGHUP the terminal may be gone
            print(f"\n[{signal.Signals(signum).name}] the program ends. {ended}".rstrip(),
                  file=sys.stderr)
        except OSError:
            pass
        return 128 + signum
