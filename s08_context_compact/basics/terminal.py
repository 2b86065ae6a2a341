"""The terminal: what the person sees and types. Lines fitted to the terminal's width,
the spinner, the model's text wrapped as it streams, the REPL with its pastes and history
file. (What the lines say about the work is report.py's.)

Machinery the chapter does not need: code.py says what happened (agent.say) and this
module decides how it looks. Nothing reaches the screen as it came: control characters in
file contents, command output, file names or the model's text are shown, not obeyed
(printable).
"""

import os
import re
import shutil
import sys
import threading
import time
import unicodedata
import warnings
from pathlib import Path

from .redaction import redact


SPINNER_FRAMES = "|/-\\"


STYLES = {"layer": "\033[36m", "tool": "\033[2m", "error": "\033[31m", "dim": "\033[2m", "title": "\033[1m"}


class Spinner:
    """A one-line "waiting…" with elapsed seconds, on a terminal only; gone when work shows up."""

    def __init__(self, stream, label: str):
        self.stream, self.label = stream, label
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True) if stream else None

    def __enter__(self) -> "Spinner":
        if self.thread:
            self.thread.start()
        return self

    def _spin(self) -> None:
        started = time.monotonic()
        for frame in iter(int, 1):  # forever, until stop()
            if self.done.wait(0.1 if frame else 0.5):  # nothing for quick work
                return
            self.stream.write(f"\r{SPINNER_FRAMES[frame % 4]} {self.label} {time.monotonic() - started:.1f}s ")
            self.stream.flush()

    def stop(self) -> None:
        if self.thread and not self.done.is_set():
            self.done.set()
            self.thread.join()
            self.stream.write("\r\033[K")  # erase the spinner line
            self.stream.flush()

    def __exit__(self, *exc) -> None:
        self.stop()


# What must never reach the terminal as it is: C0 and C1 control characters (ESC starts the
# sequences that set the clipboard, clear the screen or retitle the window), DEL, the
# bidirectional marks and overrides that reorder what is shown, and lone surrogates (bytes
# of a file name that were not UTF-8). Tabs and newlines are text.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """Text as it may be shown: every control character visible instead of obeyed. ESC is
    ^[ (caret notation for C0 and DEL), C1 and bidirectional ones <U+202E>, a byte that was
    not UTF-8 \ufffd. What the program shows passes through here; its own colours come after."""
    return CONTROL.sub(visible, text.replace("\r\n", "\n"))


def visible(match) -> str:
    char = match.group(0)
    if char < " " or char == "\x7f":
        return "^" + chr(ord(char) ^ 0x40)
    return "\ufffd" if "\ud800" <= char <= "\udfff" else f"<U+{ord(char):04X}>"


def one_line(text: str, width: int = 100) -> str:
    """Text as one line of at most width columns, cut with "…" when longer."""
    return cut_to_width(" ".join(str(text).split()), width)


def char_width(char: str) -> int:
    """Columns a character takes on a terminal: two for CJK and other wide characters."""
    if unicodedata.category(char) in ("Mn", "Me", "Cf"):  # combining marks, zero-width joiners
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def display_width(text: str) -> int:
    return len(text) if text.isascii() else sum(map(char_width, text))


def fit_prefix(text: str, width: int) -> str:
    """The longest start of text that takes at most width columns."""
    used = 0
    for index, char in enumerate(text):
        used += char_width(char)
        if used > width:
            return text[:index]
    return text


def cut_to_width(line: str, width: int) -> str:
    return line if display_width(line) <= width else fit_prefix(line, width - 1) + "…"


WIDE = "\u1100-\u115f\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
BREAKABLE = re.compile(f"[{WIDE}]|[^\\s{WIDE}]+|\\s+")  # a wide character, a word, or spaces: lines break between


def wrapped(line: str, width: int) -> list:
    """A line broken between words (or between CJK characters) into lines of at most width
    columns, the later ones indented under the first; a word wider than a line is split."""
    if display_width(line) <= width:
        return [line]
    indent = " " * min(len(line) - len(line.lstrip(" ")) + 2, width // 2)
    lines, current = [], ""
    for piece in BREAKABLE.findall(line):
        if display_width(current + piece) <= width:
            current += piece
            continue
        if current.strip():
            lines.append(current.rstrip())
            current = indent
        if piece.isspace():
            continue
        if not current.strip():  # only indentation: it gives way to the word
            current = current[:max(width - char_width(piece[0]), 0)]
        while display_width(current + piece) > width:  # a word longer than a whole line
            part = fit_prefix(piece, width - display_width(current)) or piece[0]
            lines.append(current + part)
            piece, current = piece[len(part):], indent
        current += piece
    return lines + [current.rstrip()] if current.strip() else lines


class WordWrap:
    """The model's streamed text, wrapped at word boundaries: the last word of a chunk is
    held back until the next chunk shows where it ends. Code is left as it is (inside a
    ``` fence, or on a line that starts indented): a line break inserted there would
    break what a user copies. With no width, text passes as is."""

    def __init__(self, width: int | None):
        self.width, self.column, self.word = (width - 1 if width else None), 0, ""
        self.in_code = self.indented = False

    def feed(self, chunk: str) -> str:
        if not self.width:
            return chunk
        pieces, self.word = BREAKABLE.findall(self.word + chunk), ""
        if pieces and not pieces[-1].isspace() and not re.fullmatch(f"[{WIDE}]", pieces[-1]):
            self.word = pieces.pop()  # a word: it may go on in the next chunk
        return "".join(map(self.place, pieces))

    def finish(self) -> str:
        """What is still held back; the line is then complete."""
        rest = self.place(self.word) if self.word else ""
        self.word, self.column, self.in_code, self.indented = "", 0, False, False
        return rest

    def place(self, piece: str) -> str:
        if "\n" in piece:  # a new line starts after it
            tail = piece.rsplit("\n", 1)[1]
            self.column, self.indented = display_width(tail), bool(tail)
            return piece
        if self.column == 0:
            self.indented = self.indented or piece.isspace()
            if piece.startswith("```"):
                self.in_code = not self.in_code
        width = display_width(piece)
        if self.in_code or self.indented or self.column + width <= self.width or self.column == 0:
            self.column += width  # (code, or a word longer than a line: the terminal folds it)
            return piece
        self.column = 0
        return "\n" if piece.isspace() else "\n" + self.place(piece)


def counted(n: int, noun: str) -> str:
    """"1 message", "2 messages"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def format_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if abs(n) >= 1000 else str(n)


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


def say(agent, text: str, style: str = "", cut: bool = False) -> None:
    """Tell the user something. On a terminal each line fits its width: cut to one line
    (a preview) when cut, else wrapped at word boundaries."""
    prefix = f"  [{agent.label}] " if agent.label else ""
    # The last net before the screen: a line may end where a preview was cut, inside a secret;
    # and control characters from files, commands or the model are shown, never obeyed
    lines = [prefix + agent.secrets.redact(line, cut_end=True).expandtabs() for line in printable(text).split("\n")]
    if columns := terminal_columns(agent):
        lines = [part for line in lines for part in ([cut_to_width(line, columns - 1)] if cut else
                                                     wrapped(line, columns - 1))]
    text = "\n".join(lines)
    agent.out(f"{STYLES[style]}{text}\033[0m" if agent.color and style else text)


class WarningsOnce:
    """Python's warnings (the SDK's "this model is deprecated", sent with every request)
    shown once each, as one of the program's own lines, wrapped to the terminal."""

    def __init__(self, stream):
        self.stream, self.seen = stream, set()
        warnings.filterwarnings("always", r"The model .* is deprecated", DeprecationWarning)  # not hidden: said once
        warnings.showwarning = self.show

    def show(self, message, *_) -> None:
        text = "[warning] " + " ".join(str(message).split())
        if text in self.seen:
            return
        self.seen.add(text)
        columns = shutil.get_terminal_size().columns if self.stream.isatty() else None
        print("\n".join(wrapped(text, columns - 1) if columns else [text]), file=self.stream, flush=True)


def terminal_columns(agent) -> int | None:
    """The terminal's width now (it may have been resized); None when output is not a terminal."""
    return shutil.get_terminal_size().columns if agent.fit_width else None


class StreamedText:
    """The model's text as it streams, wrapped to the terminal, any secret in it shown as
    [redacted] even when it arrives split over several chunks. What was shown is kept:
    after Ctrl-C it stays in the history (the interrupted reply the user saw)."""

    def __init__(self, agent):
        self.agent, self.wrap, self.shown = agent, WordWrap(terminal_columns(agent)), []
        self.held = agent.secrets.stream()

    def __call__(self, chunk: str) -> None:
        chunk = self.held.feed(chunk)  # any secret in it replaced, even one split over chunks
        self.shown.append(chunk)  # first: a Ctrl-C while the chunk is being printed must not lose it
        self.agent.out(self.wrap.feed(printable(chunk)), end="", flush=True)

    def finish(self, complete: bool = True) -> None:
        """End the streamed text: with a line break when the reply is complete. When it was
        cut off (Ctrl-C), what is held back (a word, or what might start a secret) stays
        unshown, and unkept: the terminal has already echoed ^C where the text stopped, and
        what is said next starts a line of its own."""
        if complete:
            held = self.held.finish()
            self.shown += [held] if held else []
            rest = self.wrap.feed(held) + self.wrap.finish()
            if self.shown:
                self.agent.out(rest)
            return
        held, text = self.wrap.word, self.text
        self.wrap.finish()
        if held and text.endswith(held):
            self.shown = [text[:-len(held)]]

    @property
    def text(self) -> str:
        """What was streamed, as far as it was shown."""
        return "".join(self.shown)


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
    if readline and readline.get_current_history_length() > first + 1:  # one entry for the message, not a line each
        for index in reversed(range(first, readline.get_current_history_length())):
            readline.remove_history_item(index)
        readline.add_history(line)
    return line


def read_more(interactive: bool) -> str | None:
    """The next line of a message of several lines; None at the end of input (Ctrl-D ends the message)."""
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
        if interactive and not isinstance(leaving, KeyboardInterrupt) and agent.log and agent.log.resume_command():
            note = f"To come back to this session later: {agent.log.resume_command()}"
            leaving.__notes__ = [*getattr(leaving, "__notes__", []), note]  # add_note(), which Python 3.10 lacks
        raise
    if interactive and agent.log and agent.log.resume_command():
        agent.say("To come back to this session later:", "dim")
        agent.out(f"  {agent.log.resume_command()}")  # one line however narrow the terminal: copied whole
    return code


def read_and_take(agent, interactive: bool, messages: list, take_line) -> int:
    interrupts, failed = 0, False
    while True:
        try:
            line = read_message(interactive)
        except EOFError:
            line = None
            if interactive and "readline" not in sys.modules:
                agent.out("")  # end the prompt's line (readline does it itself), so the shell's prompt starts on its own
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 2:
                line = None
                agent.out("")
            else:
                agent.say("\n(press Ctrl-C again, or type q, to quit)")
                continue
        if line is None or line.strip() in ("q", "exit", "quit") or line.split()[:1] in (["/exit"], ["/quit"]):
            return 1 if failed and not interactive else 0
        interrupts = 0
        if line.strip() and not take_line(agent, messages, line.strip()):
            failed = True


def terminal_confirm(interactive: bool):
    def confirm(question: str) -> tuple:
        if not interactive:
            return False, "no one could confirm it (standard input is not a terminal)"
        # wrapped between words like every other line; input() shows the last one
        *above, last = wrapped(f"{printable(question)} [y/N]", shutil.get_terminal_size().columns - 1)
        try:  # Ctrl-C here cancels the turn, as anywhere else (use_tools answers the call as interrupted)
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
    kept = [readline.get_history_item(n) for n in range(1, readline.get_current_history_length() + 1)]
    readline.clear_history()
    try:
        return input(question)
    finally:
        readline.clear_history()
        for item in kept:
            readline.add_history(item)


def history_file() -> Path | None:
    """Where the prompts typed are kept between runs (the up arrow finds them): ~/.s08_history,
    or the file S08_HISTORY names; S08_HISTORY=off keeps none."""
    setting = os.getenv("S08_HISTORY", "").strip()
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    try:
        return Path(setting).expanduser() if setting else Path.home() / ".s08_history"
    except RuntimeError:  # no home directory to expand: keep no history rather than fail
        return None


def start_repl(agent, interactive: bool, messages: list, take_line) -> int:
    if not interactive:
        return repl(agent, interactive, messages, take_line)
    try:
        import readline  # arrow keys, history and whole pastes at the prompt
    except ImportError:  # Windows has no readline: a plain prompt
        return repl(agent, interactive, messages, take_line)
    readline.parse_and_bind("set enable-bracketed-paste on")  # a paste of many lines is one message
    readline.parse_and_bind("set enable-active-region off")  # ...without showing it in reverse video
    path = history_file()
    try:
        if path and path.is_file():
            readline.read_history_file(path)
    except OSError as err:
        agent.say(f"[history] cannot read {path} ({err}); set S08_HISTORY=off to keep none.")
    try:
        return repl(agent, interactive, messages, take_line)
    finally:
        if path:
            save_history(readline, path, agent.secrets)


def banner(agent) -> None:
    sandbox = ("on" if agent.sandbox.network else "on, no network") if agent.sandbox.on else "off"
    agent.say(f"s08 context compact · {agent.settings.model} · window {agent.settings.window:,} tokens · "
              f"workspace {agent.workdir} · sandbox {sandbox}\n"
              "Type /help for commands, q to quit.")


def save_history(readline, path: Path, secrets) -> None:
    """Keep the last 1,000 one-line prompts, with any secret redacted and the file readable by its
    owner only."""
    for index in reversed(range(readline.get_current_history_length())):
        item = readline.get_history_item(index + 1) or ""
        if "\n" in item:  # the file holds a line an entry: a paste of several lines would come back in pieces
            readline.remove_history_item(index)
        elif (clean := redact(item, secrets)) != item:
            readline.replace_history_item(index, clean)
    readline.set_history_length(1000)
    try:
        readline.write_history_file(path)
        path.chmod(0o600)
    except OSError:
        pass  # a read-only home: the session itself is saved in .transcripts/
