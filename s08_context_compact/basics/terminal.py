"""The terminal: what the person sees. Lines fitted to the terminal's width, the spinner,
the model's text wrapped as it streams. (What the lines say about the work is
command_line/work_lines.py's; the prompt the person types at is command_line/repl.py's.)

Machinery the chapter does not need: what happened is said elsewhere, and this module
decides how it looks, from a Screen: the few values handed down to it. Nothing reaches
the screen as it came: control characters in file contents, command output, file
names or the model's text are shown, not obeyed (printable).
"""

import re
import shutil
import threading
import time
import unicodedata
from typing import Callable, TextIO
import warnings
from dataclasses import dataclass, field

from .redaction import Redactor


SPINNER_FRAMES = "|/-\\"


STYLES = {"layer": "\033[36m", "tool": "\033[2m", "error": "\033[31m", "dim": "\033[2m",
          "title": "\033[1m"}


@dataclass(frozen=True)
class Screen:
    """What showing a line needs: where it goes, how it looks, and what never shows."""
    out: Callable[..., None] = print     # out(text, end=..., flush=...)
    color: bool = False                  # ANSI colours
    fit_width: bool = False              # lines fitted to the terminal's width
    spinner_to: TextIO | None = None     # a terminal stream for the waiting spinner, or None
    label: str = ""                      # a subagent's lines start with it
    secrets: Redactor = field(default_factory=Redactor)


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
            seconds = time.monotonic() - started
            self.stream.write(f"\r{SPINNER_FRAMES[frame % 4]} {self.label} {seconds:.1f}s ")
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
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                     "\u2066-\u2069\ud800-\udfff]")


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
    # Measured up to the width, not to the end: a line may be a whole command's output.
    if line.isascii():
        return line if len(line) <= width else line[:width - 1] + "…"
    fits = len(fit_prefix(line, width)) == len(line)
    return line if fits else fit_prefix(line, width - 1) + "…"


WIDE = "\u1100-\u115f\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
# a wide character, a word, or spaces: lines break between
BREAKABLE = re.compile(f"[{WIDE}]|[^\\s{WIDE}]+|\\s+")


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


def say_on(screen: Screen, text: str, style: str = "", cut: bool = False) -> None:
    """Tell the user something. On a terminal each line fits its width: cut to one line
    (a preview) when cut, else wrapped at word boundaries."""
    prefix = f"  [{screen.label}] " if screen.label else ""
    # The last net before the screen: a line may end where a preview was cut, inside a secret;
    # and control characters from files, commands or the model are shown, never obeyed
    lines = [prefix + screen.secrets.redact(line, cut_end=True).expandtabs()
             for line in printable(text).split("\n")]
    if columns := terminal_columns(screen.fit_width):
        lines = [part for line in lines
                 for part in ([cut_to_width(line, columns - 1)] if cut else
                              wrapped(line, columns - 1))]
    text = "\n".join(lines)
    screen.out(f"{STYLES[style]}{text}\033[0m" if screen.color and style else text)


class WarningsOnce:
    """Python's warnings (the SDK's "this model is deprecated", sent with every request)
    shown once each, as one of the program's own lines, wrapped to the terminal."""

    def __init__(self, stream):
        self.stream, self.seen = stream, set()
        # not hidden: said once
        warnings.filterwarnings("always", r"The model .* is deprecated", DeprecationWarning)
        warnings.showwarning = self.show

    def show(self, message, *_) -> None:
        text = "[warning] " + " ".join(str(message).split())
        if text in self.seen:
            return
        self.seen.add(text)
        columns = shutil.get_terminal_size().columns if self.stream.isatty() else None
        print("\n".join(wrapped(text, columns - 1) if columns else [text]), file=self.stream,
              flush=True)


def terminal_columns(fit_width: bool) -> int | None:
    """The terminal's width now (it may have been resized); None when output is not a terminal."""
    return shutil.get_terminal_size().columns if fit_width else None


class StreamedText:
    """The model's text as it streams, wrapped to the terminal, any secret in it shown as
    [redacted] even when it arrives split over several chunks. What was shown is kept:
    after Ctrl-C it stays in the history (the interrupted reply the user saw)."""

    def __init__(self, screen: Screen):
        self.out, self.shown = screen.out, []
        self.wrap = WordWrap(terminal_columns(screen.fit_width))
        self.held = screen.secrets.stream()

    def __call__(self, chunk: str) -> None:
        chunk = self.held.feed(chunk)  # any secret in it replaced, even one split over chunks
        # first: a Ctrl-C while the chunk is being printed must not lose it
        self.shown.append(chunk)
        self.out(self.wrap.feed(printable(chunk)), end="", flush=True)

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
                self.out(rest)
            return
        held, text = self.wrap.word, self.shown_text
        self.wrap.finish()
        if held and text.endswith(held):
            self.shown = [text[:-len(held)]]

    @property
    def shown_text(self) -> str:
        """What was streamed, as far as it was shown."""
        return "".join(self.shown)
