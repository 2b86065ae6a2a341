"""How bash splits a command into words: quotes, escapes, ~, $VARIABLES, $(...) and
backquotes, pipes and other operators, redirections and here-documents. Each word knows
whether part of it is known only when the command runs (a variable, a substitution); the
names it may stand for come from its braces and wildcards, each expansion bounded.

Machinery the chapter does not need: command_risks.py reads commands with it.
"""

import fnmatch
import glob
import itertools
import os
import re

MAX_PATTERN_PARTS = 64              # folders in a glob pattern that are looked through
LOOKED_AT = 20_000                  # names a glob pattern may make the check look at
BRACE_NAMES = 64                    # names a word's braces may make the check look at
SEPARATORS = {";", "&&", "||", "|", "|&", "&", "(", ")", ";;", ";&", ";;&"}
OPERATORS = sorted(SEPARATORS | {"&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<&", "<>",
                                  ">", "<"}, key=len, reverse=True)


class Word(str):
    """A word of a command with its quotes removed. expands: part of it ($VAR, $(...), `...`)
    is known only when it runs; globs: it has an unquoted * ? or [ ."""
    expands = globs = quoted = False


def make_word(text: str, expands=False, globs=False, quoted=False) -> Word:
    word = Word(text)
    word.expands, word.globs, word.quoted = expands, globs, quoted
    return word


class Op(str):
    """An operator: a separator (; && | ...) or a redirection (> >> < << ...)."""


class Lexer:
    """Splits a script into words and operators as bash would, and collects the scripts that
    run inside it ($(...), `...`, <(...)); here-documents become the word after their <<."""

    def __init__(self, script: str, home: str):
        self.s, self.i, self.home = script, 0, home
        self.parts, self.inner, self.pending = [], [], []
        self.heredoc_next = None          # "<<" or "<<-" just read: the next word is a delimiter
        self.start_word()

    def start_word(self) -> None:
        self.chars = []
        self.expands, self.globs, self.quoted, self.started = False, False, False, False

    def add(self, text: str) -> None:
        self.chars.append(text)
        self.started = True

    def end_word(self) -> None:
        if not self.started:
            return
        word = make_word("".join(self.chars), self.expands, self.globs, self.quoted)
        if self.heredoc_next:
            self.pending.append((len(self.parts), word, self.heredoc_next == "<<-"))
            self.heredoc_next = None
        self.parts.append(word)
        self.start_word()

    def run(self) -> tuple:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t":
                self.end_word()
                self.i += 1
            elif c == "\n":
                self.end_word()
                self.parts.append(Op(";"))
                self.i += 1
                self.read_heredocs()
            elif c == "#" and not self.started:
                end = s.find("\n", self.i)
                self.i = len(s) if end == -1 else end
            elif c == "\\":
                if s[self.i + 1:self.i + 2] != "\n":
                    self.add(s[self.i + 1:self.i + 2])
                    self.quoted = True
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                end = len(s) if end == -1 else end
                self.add(s[self.i + 1:end])
                self.quoted, self.i = True, end + 1
            elif c == '"':
                self.quoted, self.i = True, self.i + 1
                self.add("")
                self.double_quoted('"')
            elif c in "$`":
                self.expansion()
            elif c in "<>" and s[self.i + 1:self.i + 2] == "(":
                self.inner.append(self.balanced(self.i + 2))
                self.add("/dev/fd/63")  # a process substitution is a pipe, named like this
            elif c in ";&|()<>":
                self.operator(c)
            elif c == "~" and not self.started:  # ~ and ~user at the start of a word: a home folder
                prefix = re.match(r"~[\w.-]*", s[self.i:]).group(0)
                self.add(self.home if prefix == "~" else os.path.expanduser(prefix))
                self.i += len(prefix)
            else:
                self.globs = self.globs or c in "*?["
                self.add(c)
                self.i += 1
        self.end_word()
        self.read_heredocs()
        return self.parts, self.inner

    def operator(self, c: str) -> None:
        if c in "<>" and self.chars and "".join(self.chars).isdigit() and not self.quoted:
            self.start_word()  # 2> : the digits name a file descriptor, not a word
        self.end_word()
        op = next(o for o in OPERATORS if self.s.startswith(o, self.i))
        self.parts.append(Op(op))
        self.i += len(op)
        if op in ("<<", "<<-"):
            self.heredoc_next = op

    def double_quoted(self, end: str | None) -> None:
        """Inside "...", or a here-document's body (end None): only $ ` and \\ are special."""
        s = self.s
        while self.i < len(s) and s[self.i] != end:
            c = s[self.i]
            if c == "\\" and s[self.i + 1:self.i + 2] in ("$", "`", '"', "\\", "\n"):
                self.add(s[self.i + 1] if s[self.i + 1] != "\n" else "")
                self.i += 2
            elif c in "$`":
                self.expansion()
            else:
                self.add(c)
                self.i += 1
        self.i += 1

    def expansion(self) -> None:
        """$(...), `...`, ${NAME}, $NAME, $'...': a script that runs, or a value known only
        then. $HOME and $PWD are known now; a $ before nothing is a dollar sign."""
        s, before = self.s, self.expands
        self.expands = True
        if s[self.i] == "`":
            end = self.i + 1
            while end < len(s) and s[end] != "`":
                end += 2 if s[end] == "\\" else 1
            self.inner.append(s[self.i + 1:end].replace("\\`", "`"))
            self.add("$(...)")
            self.i = end + 1
        elif s.startswith("$(", self.i):
            self.inner.append(self.balanced(self.i + 2))
            self.add("$(...)")
        elif s.startswith("$'", self.i):  # $'\x72m' is rm: taken as unknown
            end = self.i + 2
            while end < len(s) and s[end] != "'":
                end += 2 if s[end] == "\\" else 1
            self.add(s[self.i:end + 1])
            self.i = end + 1
        else:
            match = re.match(r"\$(\{(\w+)\}|(\w+)|\{[^}]*\}|[?@#$!*-]?)", s[self.i:])
            name = match.group(2) or match.group(3)
            alone = "$" if match.group(0) == "$" else None  # a lone $, naming nothing, is a $
            known = {"HOME": self.home, "PWD": "."}.get(name, alone)
            if known is not None:
                self.expands = before
            self.add(known if known is not None else match.group(0))
            self.i += len(match.group(0))

    def balanced(self, start: int) -> str:
        """The text from start up to the ) that closes it; self.i moves past that )."""
        s, depth, k = self.s, 1, start
        while k < len(s):
            c = s[k]
            if c == "\\":
                k += 1
            elif c in "'\"`":
                close = s.find(c, k + 1)
                while c != "'" and close != -1 and s[close - 1] == "\\":
                    close = s.find(c, close + 1)
                k = len(s) if close == -1 else close
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        self.i = k + 1
        return s[start:k]

    def read_heredocs(self) -> None:
        """After a line with <<WORD: the lines up to WORD are that here-document's text."""
        for index, delimiter, strip in self.pending:
            lines = []
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end == -1 else end
                line, self.i = self.s[self.i:end], end + 1
                if (line.lstrip("\t") if strip else line) == delimiter:
                    break
                lines.append(line)
            body = "\n".join(lines)
            if delimiter.quoted:  # <<'EOF': the text is taken as it is
                self.parts[index] = make_word(body)
                continue
            inside = Lexer(body, self.home)
            inside.double_quoted(None)
            self.inner += inside.inner
            self.parts[index] = make_word("".join(inside.chars), inside.expands)
        self.pending = []


def simple_commands(parts: list) -> list:
    """The simple commands of a script: (words, [(redirection, target word)], whether a pipe
    feeds its input)."""
    commands, words, redirects, piped = [], [], [], False
    parts = iter(parts)
    for part in parts:
        if isinstance(part, Op) and part in SEPARATORS:
            commands.append((words, redirects, piped))
            words, redirects, piped = [], [], part in ("|", "|&")
        elif isinstance(part, Op):
            target = next(parts, make_word(""))
            redirects.append((part, target if isinstance(target, Word) else make_word("")))
        else:
            words.append(part)
    commands.append((words, redirects, piped))
    return [command for command in commands if command[0] or command[1]]


def brace_group(word: str) -> tuple | None:
    """(start, end) of the first brace pair bash expands: a comma inside, no brace. One pass
    over the word (a regular expression backtracked over every comma of a brace left open)."""
    opened = None
    for k, char in enumerate(word):
        if char == "{":
            opened = k
        elif char == "}" and opened is not None:
            if "," in word[opened + 1:k]:
                return opened, k + 1
            opened = None
    return None


def braces(word: str, limit: int = BRACE_NAMES) -> list:
    """A word's brace expansions, as bash makes them ({a,b}x -> ax bx), grown a brace at a
    time and cut at each step, so {a,b}{a,b}... never doubles past the cut: at most limit
    names, and one more when there are more (the caller asks rather than check a part)."""
    words, done = [word], []
    while words and len(done) <= limit:
        each = words.pop(0)
        found = brace_group(each)
        if not found:
            done.append(each)
            continue
        start, end = found
        parts = each[start + 1:end - 1].split(",")[:limit + 1]
        grown = [each[:start] + part + each[end:] for part in parts]
        words = (grown + words)[:limit + 1 - len(done)]
    return done


def matching(pattern: str, limit: int, looked_at: int = LOOKED_AT) -> list | None:
    """The names a glob pattern matches, at most limit; None when finding them means looking
    at more than looked_at names or more than MAX_PATTERN_PARTS folders deep: two links to .
    make */*/*/... as many paths as 2 to the depth. As glob does, a wildcard matches no
    leading dot, and a pattern ending in / matches folders only."""
    if pattern.count("/") > MAX_PATTERN_PARTS:
        return None
    parts, folders_only = [part for part in pattern.split("/") if part], pattern.endswith("/")
    paths, seen = ["/" if pattern.startswith("/") else ""], 0
    for k, part in enumerate(parts):
        last, found = k == len(parts) - 1, []
        for base in paths:
            if glob.has_magic(part):
                names, scanned = listed(base or ".", part, looked_at - seen)
            else:
                names, scanned = [part], 1
            seen += scanned
            if names is None or seen > looked_at:
                return None
            for name in names:
                path = os.path.join(base, name) if base else name
                if os.path.isdir(path) if not last or folders_only else os.path.lexists(path):
                    found.append(path + "/" if last and folders_only else path)
        paths = found
    return paths[:limit]


def listed(folder: str, part: str, room: int) -> tuple:
    """(the names in folder a wildcard part matches, or None when it holds more than room; how
    many names were looked at)."""
    try:
        with os.scandir(folder) as entries:
            names = [entry.name for entry in itertools.islice(entries, max(room, 0) + 1)]
    except OSError:
        return [], 1
    if len(names) > room:
        return None, len(names)
    hidden = part.startswith(".")
    visible = [name for name in names if hidden or not name.startswith(".")]
    return [name for name in visible if fnmatch.fnmatchcase(name, part)], len(names) or 1
