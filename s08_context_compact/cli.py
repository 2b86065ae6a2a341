"""The command line around the agent: arguments, configuration from the environment
and .env files, the checks made before the first prompt, and a clean exit on Ctrl-C or a
closed pipe.

Machinery the chapter does not need: code.py's main() asks configure() for what it needs
to build the agent, and runs; SIGTERM and SIGHUP end it cleanly (Stop).
"""

import argparse
import importlib.util
import os
import shutil
import signal
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from endpoint import (CONNECT_TIMEOUT, DEFAULT_WINDOW_SOURCE, IDLE_TIMEOUT, Endpoint, discover_endpoint,
                      make_client)
from redaction import secret_values
from session_log import find_session, list_sessions, logged_endpoint


SETUP_HELP = """{problem}
Copy .env.example to .env and fill in MODEL_ID and either ANTHROPIC_API_KEY or
ANTHROPIC_AUTH_TOKEN (a token sent as "Authorization: Bearer", as proxies such
as OpenRouter want), plus ANTHROPIC_BASE_URL for an Anthropic-compatible
endpoint; or export them in your shell. See README.md, section "Set up"."""


def dotenv_paths() -> list:
    return [Path.cwd() / ".env", Path(__file__).resolve().parent.parent / ".env"]


def load_configuration() -> None:
    from dotenv import load_dotenv  # imported here so that importing this file does no work
    for path in dotenv_paths():
        load_dotenv(path)


def dotenv_files() -> tuple:
    """The values in the .env files of the working folder and the repository root."""
    from dotenv import dotenv_values
    return tuple(dotenv_values(path) for path in dotenv_paths() if path.is_file())


def seconds_setting(name: str, default: float) -> float:
    value = os.getenv(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1
    if not 0 < seconds <= 3600:
        raise ValueError(f"{name}={value!r} must be a number of seconds between 0 and 3600.")
    return seconds


def ttl_setting() -> str:
    ttl = os.getenv("CACHE_TTL", "5m").strip() or "5m"
    if ttl not in ("5m", "1h"):  # the prompt cache lives five minutes, or an hour
        raise ValueError(f"CACHE_TTL={ttl!r} must be 5m or 1h.")
    return ttl


def parse_arguments(argv):
    parser = argparse.ArgumentParser(description="s08: a coding agent with context compaction. "
                                     "Run it in the folder the agent should work in.",
                                     epilog="Configuration (environment or .env): MODEL_ID, ANTHROPIC_API_KEY or "
                                     "ANTHROPIC_AUTH_TOKEN, and optionally ANTHROPIC_BASE_URL, CONTEXT_WINDOW, "
                                     "API_CONNECT_TIMEOUT, API_IDLE_TIMEOUT, CACHE_TTL, S08_HISTORY. At the prompt, "
                                     "/help lists the commands. README.md has the rest.")
    parser.add_argument("--resume", nargs="?", const="latest", metavar="ID",
                        help="continue the most recent session in this folder, or session ID")
    parser.add_argument("--list", action="store_true", help="list this folder's sessions and exit")
    parser.add_argument("--demo", action="store_true",
                        help="watch every layer fire, offline: a scripted model, no API key needed")
    parser.add_argument("--no-pause", action="store_true", help="with --demo: do not wait for Enter between steps")
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
    client: object = None
    endpoint: Endpoint = None
    idle_timeout: float = IDLE_TIMEOUT
    cache_ttl: str = "5m"
    resume: Path | None = None
    interactive: bool = False
    secrets: list = field(default_factory=list)
    screen: dict = field(default_factory=dict)    # how the agent shows things: a terminal, or not


def configure(argv) -> Config | int:
    """The configuration, or an exit code once --list (or a mistake, explained) has been dealt with."""
    args = parse_arguments(argv)
    if (args.demo or not args.list) and (missing := missing_requirements()):
        root = Path(__file__).resolve().parent.parent
        print(INSTALL_HELP.format(python=sys.executable, missing=" and ".join(missing), root=root,
                                  make_venv="" if (root / ".venv").is_dir() else "python3 -m venv .venv && "),
              file=sys.stderr)
        return 2
    if args.demo:
        return Config(demo=True, pause=sys.stdin.isatty() and not args.no_pause)
    if args.list:
        print(list_sessions(Path.cwd(), shutil.get_terminal_size().columns if sys.stdout.isatty() else None))
        return 0
    load_configuration()
    warnings.showwarning = lambda message, *_: print(f"[warning] {str(message).splitlines()[0]}", file=sys.stderr)
    missing = ([] if os.getenv("ANTHROPIC_API_KEY") or os.getenv("ANTHROPIC_AUTH_TOKEN") else
               ["Neither ANTHROPIC_API_KEY nor ANTHROPIC_AUTH_TOKEN is set."]) + \
        ([] if os.getenv("MODEL_ID") else ["MODEL_ID is not set."])
    if missing:
        print(SETUP_HELP.format(problem=" ".join(missing)), file=sys.stderr)
        return 2
    model, workdir = os.environ["MODEL_ID"], Path.cwd()
    try:
        resume = find_session(workdir, args.resume) if args.resume else None
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        idle = seconds_setting("API_IDLE_TIMEOUT", IDLE_TIMEOUT)
        client = make_client(seconds_setting("API_CONNECT_TIMEOUT", CONNECT_TIMEOUT), idle)
        endpoint = discover_endpoint(client, model, logged_endpoint(resume, model) if resume else None)
        ttl = ttl_setting()
    except ValueError as err:
        print(f"{err} Set it in .env or in your shell (README.md, section Configuration).", file=sys.stderr)
        return 2
    sys.stdout.reconfigure(line_buffering=True, errors="replace")  # line by line; never dies on a character
    sys.stdin.reconfigure(errors="replace")  # bytes that are not UTF-8 must not end the session
    terminal = sys.stdout.isatty()
    return Config(model=model, workdir=workdir, client=client, endpoint=endpoint, idle_timeout=idle, cache_ttl=ttl,
                  resume=resume, interactive=sys.stdin.isatty(), secrets=secret_values(os.environ, dotenv_files()),
                  screen={"show_status": terminal, "color": terminal and not os.getenv("NO_COLOR"),
                          "fit_width": terminal, "spinner_to": sys.stdout if terminal else None})


def say_what_start_up_found(agent) -> None:
    endpoint = agent.endpoint
    if endpoint.startup_problem:
        agent.say(f"[endpoint] {endpoint.startup_problem} The first message will fail the same way until "
                  "this is fixed.", "error")
    if endpoint.window_source == DEFAULT_WINDOW_SOURCE:
        agent.say(f"[window] nothing says how big {endpoint.model}'s window is; assuming {endpoint.window:,} "
                  "tokens. Set CONTEXT_WINDOW if you know it; otherwise the endpoint's first \"too long\" "
                  "answer will tell.")


STOP_SIGNALS = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]  # Windows: no SIGHUP


class Stop(BaseException):
    """SIGTERM or SIGHUP: leave now, once what is running has been ended. A BaseException,
    like Ctrl-C's KeyboardInterrupt, so no handler of ordinary errors swallows it."""


def stop_on_signal(signum: int, frame) -> None:
    for stop_signal in STOP_SIGNALS:  # a second signal must not interrupt the ending
        signal.signal(stop_signal, signal.SIG_IGN)
    raise Stop(signum)


def run(main) -> int:
    """main(), with the ways out a person (or the system) causes handled quietly. SIGTERM
    and SIGHUP end the running command's processes (workspace_io.run_command does, as the
    exception passes) and exit with 128 + the signal's number, as a shell would report."""
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, stop_on_signal)
    try:
        return main()
    except KeyboardInterrupt:  # Ctrl-C before the prompt is up (or at the demo's pause): leave quietly
        print(file=sys.stderr)  # ...and let the shell's prompt start on a line of its own
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say, and no one to say it to
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 141  # 128 + SIGPIPE, as a shell command would
    except Stop as stop:
        signum = stop.args[0]
        ended = " ".join(getattr(stop, "__notes__", []))
        try:  # after SIGHUP the terminal may be gone
            print(f"\n[{signal.Signals(signum).name}] the program ends. {ended}".rstrip(), file=sys.stderr)
        except OSError:
            pass
        return 128 + signum
