"""The REPL: the prompt a person types at, with pastes of several lines, the commands' help,
a question that asks for a yes, and the prompts kept between runs.

Machinery the chapter does not need. It reads what a person types and decides nothing
about it: each message goes to the take_line it is handed, and user_turns.py, beside it,
decides what the message does.
"""

import os
import shutil
import stat
import sys
from pathlib import Path

from ..basics import file_kind, history_file, printable, redact, wrapped
from ..safety import changed_by_command, passes_through


HELP = """Commands:
  /compact [focus]  summarize the conversation now; the focus text steers the summary
  /context          what fills the context, and how close it is to auto-compact
  /clear            start a new conversation (the session log keeps the old one)
  /undo, /redo      put back the files your last request changed; /redo undoes that
  /report           a picture of this session (an HTML page): the context, each layer, the cost
  /help             this text
  /exit, q          leave (so do /quit, exit, quit, Ctrl-D and Ctrl-C twice)
Ctrl-C stops the model or a tool and returns here; the conversation is kept.
A paste of several lines is one message; so is a block typed between two lines of \"\"\".
Run with --list to see this folder's sessions, --resume [ID] to continue one,
--report [ID] to picture one."""


def read_line(interactive: bool, prompt: str = "s08 >> ") -> str | None:
    if interactive:
        return input(prompt)
    line = sys.stdin.readline()
    return line.removesuffix("\n") if line else None


def read_message(interactive: bool) -> str | None:
    """One message: a line, or several. A paste arrives whole where the terminal marks
    pastes (bracketed paste, start_repl turns it on). Elsewhere a line of three double
    quotes starts a block that the next such line ends, and a line ending in a backslash
    goes on to the next."""
    readline = sys.modules.get("readline") if interactive else None
    first = readline.get_current_history_length() if readline else 0
    line = read_line(interactive)
    if line is not None and line.strip() == '"""':
        block = []
        while (more := read_more(interactive)) is not None and more.strip() != '"""':
            block.append(more)
        line = "\n".join(block)
    else:
        while line is not None and line.endswith("\\"):
            more = read_more(interactive)
            line = line[:-1] + ("" if more is None else "\n" + more)
            if more is None:
                break
    # one entry for the message, not a line each
    if readline and readline.get_current_history_length() > first + 1:
        for index in reversed(range(first, readline.get_current_history_length())):
            readline.remove_history_item(index)
        readline.add_history(line)
    return line


def read_more(interactive: bool) -> str | None:
    """The next line of a message of several lines;
    None at the end of input (Ctrl-D ends the message)."""
    try:
        return read_line(interactive, "... ")
    except EOFError:
        return None


def repl(agent, interactive: bool, messages: list, take_line) -> int:
    """Read messages and hand each to take_line(agent, messages, line), which says whether it
    went well; return the exit code. Piped input ends with 1 if a turn ended in an API
    error, so a script can tell. Leaving on a terminal, by a word, Ctrl-D, Ctrl-C twice or
    SIGTERM, says how to come back."""
    try:
        code = read_and_take(agent, interactive, messages, take_line)
    except BaseException as leaving:  # SIGTERM or SIGHUP: cli.py says it, with this note
        if (interactive and not isinstance(leaving, KeyboardInterrupt)
                and agent.log and agent.log.resume_command()):
            note = f"To come back to this session later: {agent.log.resume_command()}"
            # add_note(), which Python 3.10 lacks
            leaving.__notes__ = [*getattr(leaving, "__notes__", []), note]
        raise
    if interactive and agent.log and agent.log.resume_command():
        agent.say("To come back to this session later:", "dim")
        # one line however narrow the terminal: copied whole
        agent.out(f"  {agent.log.resume_command()}")
    return code


def read_and_take(agent, interactive: bool, messages: list, take_line) -> int:
    interrupts, failed = 0, False
    while True:
        try:
            line = read_message(interactive)
        except EOFError:
            line = None
            if interactive and "readline" not in sys.modules:
                # end the prompt's line (readline does it itself),
                # so the shell's prompt starts on its own
                agent.out("")
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 2:
                line = None
                agent.out("")
            else:
                agent.say("\n(press Ctrl-C again, or type q, to quit)")
                continue
        if (line is None
                or line.strip() in ("q", "exit", "quit")
                or line.split()[:1] in (["/exit"], ["/quit"])):
            return 1 if failed and not interactive else 0
        interrupts = 0
        if line.strip() and not take_line(agent, messages, line.strip()):
            failed = True


def terminal_confirm(interactive: bool):
    def confirm(question: str) -> tuple:
        if not interactive:
            return False, "no one could confirm it (standard input is not a terminal)"
        # wrapped between words like every other line; input() shows the last one
        *above, last = wrapped(f"{printable(question)} [y/N]",
                               shutil.get_terminal_size().columns - 1)
        # Ctrl-C here cancels the turn, as anywhere else
        # (use_tools answers the call as interrupted)
        try:
            if above:
                print("\n".join(above))
            answer = answer_without_history(f"{last} ").strip().lower()
        except EOFError:
            answer = ""
        return (True, "") if answer in ("y", "yes") else (False, "the user said no")
    return confirm


def answer_without_history(question: str) -> str:
    """input() with the prompt history out of reach: the up arrow must never bring back an
    earlier "y" to a question that may delete files, and the answer is no prompt to keep."""
    readline = sys.modules.get("readline")  # loaded by start_repl on a terminal, if there is one
    if readline is None:
        return input(question)
    kept = [readline.get_history_item(n)
            for n in range(1, readline.get_current_history_length() + 1)]
    readline.clear_history()
    try:
        return input(question)
    finally:
        readline.clear_history()
        for item in kept:
            readline.add_history(item)


def start_repl(agent, interactive: bool, messages: list, take_line) -> int:
    if not interactive:
        return repl(agent, interactive, messages, take_line)
    try:
        import readline  # arrow keys, history and whole pastes at the prompt
    except ImportError:  # Windows has no readline: a plain prompt
        return repl(agent, interactive, messages, take_line)
    # a paste of many lines is one message...
    readline.parse_and_bind("set enable-bracketed-paste on")
    # ...without showing it in reverse video
    readline.parse_and_bind("set enable-active-region off")
    path, refused = history_place(history_file(), agent.workdir)
    if refused:
        agent.say(refused)
    try:
        if path and path.exists():
            readline.read_history_file(path)
    except OSError as err:
        agent.say(f"[history] cannot read {path} ({err}); set S08_HISTORY=off to keep none.")
    try:
        return repl(agent, interactive, messages, take_line)
    finally:
        if path:  # looked at again: a command may have planted something there since
            path, refused = history_place(path, agent.workdir)
            agent.say(refused) if refused else save_history(readline, path, agent.secrets)


def history_place(path: Path | None, workdir: Path) -> tuple:
    """(the history file to read and write, or None; a line saying why not). The program
    writes it outside the sandbox, so only what a command cannot have planted is used: a
    regular file, or nothing yet, reached through no link in the workspace and changed by no
    command."""
    if path is None:
        return None, ""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        why = ""
    except OSError as err:
        why = err.strerror or str(err)
    else:
        why = "" if stat.S_ISREG(mode) else file_kind(mode)
    links = passes_through(path, os.path.realpath(workdir))
    why = (why
           or (links and f"reached through a link inside the workspace ({links[0]})")
           or changed_by_command(path))
    if not why:
        return path, ""
    return None, (f"[history] {path} is not used ({why}): "
                  "prompts are neither read from it nor kept in it. "
                  "Remove it, or set S08_HISTORY to another file (off keeps none).")


def banner(agent) -> None:
    sandbox = ("on" if agent.sandbox.network else "on, no network") if agent.sandbox.on else "off"
    agent.say(f"s08 context compact · {agent.settings.model} · "
              f"window {agent.settings.window:,} tokens · "
              f"workspace {agent.workdir} · sandbox {sandbox}\n"
              "Type /help for commands, q to quit.")


def save_history(readline, path: Path, secrets) -> None:
    """Keep the last 1,000 one-line prompts, with any secret redacted and the file readable by
    its owner only."""
    for index in reversed(range(readline.get_current_history_length())):
        item = readline.get_history_item(index + 1) or ""
        # the file holds a line an entry: a paste of several lines would come back in pieces
        if "\n" in item:
            readline.remove_history_item(index)
        elif (clean := redact(item, secrets)) != item:
            readline.replace_history_item(index, clean)
    readline.set_history_length(1000)
    try:
        # never a link's
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600))
        readline.write_history_file(path)
        path.chmod(0o600)  # a regular file: looked at just now, and no command runs between turns
    except OSError:
        pass  # a read-only home: the session itself is saved in .transcripts/
