"""What a bash command may do that needs a person's yes first: delete, empty or overwrite
files, or touch paths outside the workspace. command_risks() reads the command as the
shell would split it (quotes, escapes, pipes, redirections, $(...) and here-documents)
and names each reason; the permission check turns the reasons into allow, ask or
deny.

Machinery the chapter does not need. It reads the text of the command, so it cannot see
what that text becomes when it runs: a script the command runs, a variable's value, text
built and then eval'ed, an alias. Words it cannot know (a command named by a variable)
make it ask; what a script does inside is not checked. Only an operating-system sandbox
confines a command whatever it says: sandbox.py, where bubblewrap is installed.
"""

import os
import re
from pathlib import Path

from .command_copies import Copies
from .command_kinds import (DELETES, CHANGES, COPIES, COPY_WALK_LIMIT, OUTPUT_OPTIONS, SHELLS,
                            CODE_FLAGS, INTERPRETER, LANGUAGE, RISKY_CODE, QUOTED_PATH,
                            PATTERN_FIRST, TEXT_ONLY, WRAPPERS, STDIN_NAMES, IN_PLACE_EDITORS,
                            KEYWORDS)
from ..basics import FOLDER, REDACTED, in_own_folder, one_line, resolved, walk_tree
from .sandbox import PRIVATE
from .shell_words import (BRACE_NAMES, LOOKED_AT, MAX_PATTERN_PARTS, Lexer, Word, braces,
                          make_word, matching, simple_commands)

# Refused outright, whatever anyone answers: these are never part of a coding task.
DENY_PATTERNS = [r"\brm\s+-[a-zA-Z]*r[a-zA-Z]*f?\s+(/|~|\$HOME)(\s|$)", r"\bsudo\b", r"\bmkfs",
                 r"\bdd\b.*\bof=/dev/", r"\b(shutdown|reboot|halt|poweroff)\b", r":\(\)\s*\{",
                 r">\s*/dev/sd", r"\bchmod\s+-R\s+777\s+/(\s|$)"]

# Outside the workspace, these may be used without asking: devices that hold no data, and
# (for reading only) the system's programs and libraries. The program run may live anywhere:
# /usr/bin/python or ~/.local/bin/ruff is a tool, not a file the command touches. Everything
# else outside asks, /tmp and /etc included: /tmp is shared and /etc holds configuration.
DEVICES = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd", "/proc/self/fd")
READABLE = DEVICES + ("/dev/zero", "/dev/random", "/dev/urandom", "/dev/stdin",
                      "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# In the sandbox the PRIVATE places are each command's own and writable: a write there
# succeeds (a file moved there is gone with the command), and a path there is not what the
# host shows. /tmp starts empty and reaches nothing, so reading and writing it asks nothing;
# /dev and /proc still ask (in the command's own /proc, /proc/2/cwd is its shell's folder,
# the workspace).
OWN_TMP = "/tmp"

# Commands that only read what they are given: they may look into the program's own folders.
READ_ONLY = {"cat", "less", "more", "head", "tail", "grep", "egrep", "fgrep", "rg", "ag", "ls",
             "wc", "file", "stat", "diff", "cmp", "jq", "du", "tree", "find", "zcat", "nl", "od",
             "xxd", "hexdump", "strings", "md5sum", "sha256sum", "sha1sum", "cut", "sort", "uniq",
             "column", "realpath", "readlink", "basename", "dirname"}
# The files the program reads secrets from (redaction.py): a command that names one asks.
SECRET_FILES = (".env",)
# How a question names a folder of OWN_FOLDERS.
OWN_FOLDER = "the program's own folder (its session logs and saved outputs)"
# Text of the command that may end up in a file: a redirection, a here-document, tee, an
# in-place edit.
WRITES_TEXT = re.compile(r">|<<|\btee\b|\b(sed|perl|ruby)\s+(-\w+\s+)*-\w*i|\b(ex|vim?)\s")

MAX_DEPTH = 5                       # scripts inside scripts inside ...: deeper than this asks


def command_risks(command: str, workdir: Path, sandboxed: bool = False) -> tuple:
    """(reasons to deny, reasons to ask) for one bash command run in workdir; when both
    are empty it may run without asking. In the sandbox (sandbox.py) a write outside the
    workspace does not ask: the operating system refuses it, and the command says so."""
    deny = ["is on the deny list"] if any(re.search(p, command) for p in DENY_PATTERNS) else []
    # write_file and edit_file put the real values back
    if REDACTED in command and WRITES_TEXT.search(command):
        deny.append(f"writes {REDACTED}, the placeholder for a secret you were shown, where the "
                    "real value belongs; change such files with edit_file, which keeps the real "
                    "values")
    judge = Judge(workdir, sandboxed)
    try:
        judge.script(command)
    except RecursionError:
        # nested past what Python's stack holds: the check cannot say, a person can
        judge.ask("is nested too deeply to check")
    return deny, list(dict.fromkeys(judge.reasons))


class Judge(Copies):
    """Reads a script command by command and collects the reasons to ask. The folder a
    `cd` moves to is followed, so relative paths are judged where they will be used.
    Copies (command_copies.py) judges cp, mv, install, ln and rsync."""

    def __init__(self, workdir: Path, sandboxed: bool = False):
        self.top, self.sandboxed = Path(os.path.normpath(workdir.absolute())), sandboxed
        self.scratch = (OWN_TMP,) if sandboxed else ()  # the command's own /tmp, in the sandbox
        self.root, self.cwd, self.home = workdir.resolve(), self.top, str(Path.home())
        self.reasons, self.depth, self.running = [], 0, ""

    def ask(self, reason: str) -> None:
        self.reasons.append(reason)

    def expanded(self, word: Word) -> list:
        """The names a word's braces make; past BRACE_NAMES, the first ones, and it asks."""
        names = braces(str(word))
        if len(names) > BRACE_NAMES:
            self.ask(f"names more than {BRACE_NAMES} files by its braces, too many to check "
                     f"({one_line(str(word), 80)})")
        return names[:BRACE_NAMES]

    def matching(self, word: Word) -> list:
        """What a word with a wildcard names here; a pattern too deep to look at asks."""
        names = matching(str(self.path(word)), COPY_WALK_LIMIT)
        if names is None:
            self.ask(f"names files by a pattern that would make the check look at over "
                     f"{LOOKED_AT:,} names or {MAX_PATTERN_PARTS} folders deep "
                     f"({one_line(str(word), 80)})")
        return names or []

    def script(self, text: str) -> None:
        if self.depth > MAX_DEPTH:
            return self.ask("nests scripts too deeply to check")
        self.depth += 1
        parts, inner = Lexer(text, self.home).run()
        # what echo or printf put on the pipe, word by word: xargs makes arguments of it
        printed = None
        for words, redirects, piped in simple_commands(parts):
            stdin = self.redirections(redirects)
            words = self.drop_keywords(words)
            if piped and stdin is None and printed is not None:
                stdin = make_word(" ".join(printed))
            self.command(words, stdin, piped)
            prints = words and words[0] in ("echo", "printf")
            printed = words[1:] if prints and not any(w.expands for w in words) else None
        cwd = self.cwd
        for sub in inner:  # $(...) runs in a subshell: its cd goes no further
            self.script(sub)
            self.cwd = cwd
        self.depth -= 1

    def drop_keywords(self, words: list) -> list:
        """The command itself: without if/while/!/{ before it, or NAME=value assignments.
        `for NAME in WORDS` and `case WORD in` run nothing (their words may still be paths)."""
        while words and not words[0].quoted and (words[0] in KEYWORDS
                                                 or re.match(r"^[A-Za-z_]\w*=", words[0])):
            words = words[1:]
        if words and words[0] in ("for", "case") and not words[0].quoted:
            for word in words[words.index("in") + 1:] if "in" in words else []:
                self.check_path(word)
            return []
        return words

    def redirections(self, redirects: list) -> str | None:
        """Judge each redirection; return a here-document's text (the command's input), if any."""
        stdin = None
        for op, target in redirects:
            if op in ("<<", "<<-", "<<<"):
                stdin = target
            elif op in (">&", "<&") and (target.isdigit() or target == "-"):
                continue  # 2>&1: a file descriptor, not a file
            elif op in ("<", "<&"):
                self.check_path(target, "reads")
            else:
                self.check_write(target, overwrite=op not in (">>", "&>>"), how=op)
        return stdin

    # ---- paths ----

    def path(self, word: str) -> Path:
        return Path(os.path.normpath(self.cwd / word))

    def outside(self, word: Word, allowed: tuple = ()) -> bool:
        path = self.path(word)
        if any(path.is_relative_to(place) for place in allowed) or self.in_scratch(path):
            return False
        try:
            real = path.resolve()  # a symlink inside the workspace may point out of it
        except (OSError, RuntimeError):
            real = path
        return not real.is_relative_to(self.root) and not self.in_scratch(real)

    def in_scratch(self, path: Path) -> bool:
        """Whether path is in the command's own /tmp: where it leads (a link in the workspace
        may lead there: cache -> /tmp), unless that is in the workspace, which may itself lie
        in /tmp (the sandbox puts the real one there)."""
        real = resolved(path) or path
        if real.is_relative_to(self.root):
            return False
        return any(p.is_relative_to(place) for p in (path, real) for place in self.scratch)

    def check_path(self, word: Word, verb: str = "uses") -> None:
        """A word that may name a file the command reads (or otherwise uses)."""
        # {a,b}/x: each way
        if not word.quoted and (names := self.expanded(word)) != [str(word)]:
            for each in names:
                self.check_path(make_word(each, word.expands, word.globs), verb)
            return
        if not word.expands and verb != "reads" and self.running not in READ_ONLY and \
                (own := self.own_folder(self.path(word), itself=True)):
            self.ask(f"{verb} {word}, in {own}/, {OWN_FOLDER}")
        names = self.matching(word) if word.globs else [str(word)]
        secrets = any(os.path.basename(os.path.normpath(n)) in SECRET_FILES for n in names)
        if not word.expands and secrets:
            self.ask(f"{verb} {word}, which holds secrets: read_file shows them redacted, while a "
                     "command may print them in a form redaction cannot see (hex, folded, spaced)")
        # judged by what comes before the first $: /proc/$PPID/environ is in /proc
        if word.expands:
            known = word.split("$", 1)[0]
            folder = make_word(known.rpartition("/")[0] or "/")
            if "/" in known and self.outside(folder, READABLE):
                self.ask(f"{verb} {word}, in {self.path(known)}, outside the workspace")
            elif not known and "/" in word:
                self.ask(f"{verb} a path known only when it runs ({word})")
        elif word.startswith("file://"):
            self.check_path(make_word(word[len("file://"):]), verb)
        elif word and self.outside(word, READABLE):
            self.ask(f"{verb} {self.leads(self.path(word))}, outside the workspace")
        elif word.globs:  # */secret.txt may pass through a link that leads out
            outside = [m for m in self.matching(word) if self.outside(make_word(m))]
            if outside:
                self.ask(f"{verb} {outside[0]} through a link, outside the workspace ({word})")

    def refused_by_sandbox(self, path: Path) -> bool:
        """Whether the sandbox refuses a write to path outside the workspace: read-only there,
        unless the path (or where it leads) is in a place of the command's own."""
        real = resolved(path) or path
        private = any(p.is_relative_to(place) for p in (path, real) for place in PRIVATE)
        return self.sandboxed and not private

    def leads(self, path: Path) -> str:
        """A path as a question names it: where a link in it leads, when it leads elsewhere."""
        real = resolved(path)
        return f"{path} (which leads to {real})" if real is not None and real != path else str(path)

    def own_folder(self, path: Path, itself: bool = False) -> str | None:
        """The program's own folder a path is in, if any; with itself, the folder itself counts
        too (moving it away is as bad as writing in it)."""
        return in_own_folder(self.root, path, itself)

    def ask_writes_into(self, own: str) -> None:
        self.ask(f"writes into {own}/, {OWN_FOLDER}")

    def check_write(self, word: Word, overwrite: bool, how: str) -> None:
        """A file the command writes: outside the workspace, or (overwrite) an existing one,
        asks."""
        # tee {a,../x}: each name
        if not word.quoted and (names := self.expanded(word)) != [str(word)]:
            for each in names:
                self.check_write(make_word(each, word.expands, word.globs), overwrite, how)
            return None
        if word.expands:
            return self.ask(f"writes to a file named only when it runs ({how} {word})")
        path = self.path(word)
        if any(path.is_relative_to(device) for device in DEVICES) or self.in_scratch(path):
            # a device, or the command's own /tmp: empty at its start, thrown away at its end
            return None
        if self.outside(word):
            return None if self.refused_by_sandbox(path) else \
                self.ask(f"writes {self.leads(path)}, outside the workspace")
        if own := self.own_folder(path, itself=True):
            return self.ask_writes_into(own)
        names = self.matching(word) if word.globs else [str(path)]
        existing = [name for name in names if os.path.lexists(name) and not os.path.isdir(name)]
        if overwrite and existing:
            self.ask(f"overwrites {os.path.relpath(existing[0], self.top)} ({how})")

    # ---- commands ----

    def command(self, words: list, stdin: str | None = None, piped: bool = False) -> None:
        if not words:
            return
        head, args = words[0], words[1:]
        if head.expands:
            self.ask(f"runs a command known only when it runs ({head})")
            return self.check_operands(args)
        name = self.running = os.path.basename(head)
        if name in WRAPPERS:
            return self.wrapped(name, args, stdin, piped)
        if name in DELETES:
            self.ask(f"deletes or empties files ({name})")
            return self.check_operands(args, verb="writes")
        if name in CHANGES:
            self.ask(f"{CHANGES[name]} ({name})")
        if name == ".":
            name = "source"
        scripted = any(w.startswith(("-e", "-s", "-E", "-c", "+")) for w in args)
        if IN_PLACE_EDITORS.match(name) and (name in ("ex", "ed") or scripted):
            self.ask(f"edits files in place ({name})")
        if handler := getattr(self, f"run_{name}", None):
            return handler(args)
        if interpreter := INTERPRETER.match(name):
            language = LANGUAGE.get(interpreter[1], interpreter[1])
            return self.interpreter(language, args, stdin, piped)
        if name in SHELLS:
            return self.shell(name, args, stdin, piped)
        if name in COPIES:
            return self.copy(name, args)
        if name in PATTERN_FIRST:
            return self.pattern_first(name, args)
        if name in OUTPUT_OPTIONS:
            return self.output_option(name, args)
        if name not in TEXT_ONLY:
            self.check_operands(args)

    def check_operands(self, args: list, verb: str = "uses") -> None:
        """Arguments that may be files: each one outside the workspace asks."""
        for word in args:
            if word.startswith("-") and "=" in word:
                value = make_word(word.split("=", 1)[1], word.expands)
                if value.startswith(("/", "../")) or value == "..":
                    self.check_path(value, verb)
            elif not word.startswith("-") or word == "-":
                self.check_path(word, verb)

    def wrapped(self, name: str, args: list, stdin, piped: bool) -> None:
        """env, nice, timeout, xargs ...: the command they run is judged."""
        takes_value, operands = WRAPPERS[name]
        if name == "command" and args and args[0] in ("-v", "-V"):
            return
        k = 0
        while k < len(args) and (args[k].startswith("-") or name == "env" and "=" in args[k]):
            if name == "env" and args[k] in ("-S", "--split-string") and k + 1 < len(args):
                # env -S 'rm x': the string is the command
                return self.script(" ".join(args[k + 1:]))
            chdir = args[k] in ("-C", "--chdir") or args[k].startswith(("-C", "--chdir="))
            if name == "env" and chdir:
                if args[k] in ("-C", "--chdir") and k + 1 < len(args):
                    folder = args[k + 1]
                else:  # -Cdir, --chdir=dir
                    joined = args[k].split("=", 1)[1] if "=" in args[k] else args[k][2:]
                    folder = make_word(joined, args[k].expands)
                self.run_cd([folder])  # what follows runs there: its paths are judged from there
            k += 2 if args[k] in takes_value else 1
        rest = args[k + operands:]
        # xargs cat <<< ../key: the input's words are arguments
        if name == "xargs" and stdin is not None:
            rest = rest + [make_word(w) for w in str(stdin).split()]
        if name == "flock":  # its lock file is made if missing
            self.check_operands(args[k:k + operands], verb="writes")
        if name == "flock" and rest[:1] in (["-c"], ["--command"]):
            return self.script(" ".join(rest[1:]))
        self.command(rest, stdin, piped)

    def interpreter(self, language: str, args: list, stdin, piped: bool) -> None:
        """python -c, perl -e, node -e ... and a script on standard input: the code is read
        for words that delete, write or run other programs. A script file is not read."""
        code, k = None, 0
        while k < len(args) and args[k].startswith("-") and args[k] != "-":
            flag = args[k]
            if language in ("perl", "ruby") and re.match(r"^-[plnaswWtTuUcS0-9]*i", flag):
                self.ask(f"edits files in place ({language} {flag})")
            perl_code = language == "perl" and re.match(r"^-[a-zA-Z0-9]*[eE]$", flag)
            if flag in CODE_FLAGS[language] or perl_code:
                code = args[k + 1] if k + 1 < len(args) else make_word("")
                k += 2
                break
            if language == "python" and flag == "-m":  # a module runs: the rest are its arguments
                return self.check_operands(args[k + 2:])
            k += 2 if language == "python" and flag in ("-W", "-X") else 1
        rest = args[k:]
        if code is None and (not rest or rest[0] == "-"):
            if stdin is None and piped:
                return self.ask(f"runs {language} code from its input, which cannot be checked")
            code = stdin
        if code is None:
            return self.check_operands(rest)
        if code.expands:
            self.ask(f"runs {language} code known only when it runs")
        elif risky := RISKY_CODE.search(code):
            self.ask(f"runs {language} code that can delete, write or run programs "
                     f"({risky.group(0).strip()})")
        for path in QUOTED_PATH.findall(code):
            self.check_path(make_word(os.path.expanduser(path)))
        for name in re.findall(r"""['"]((?:\./)?\.env)['"]""", code):  # open('.env') in the code
            self.check_path(make_word(name), "reads")
        self.check_operands(rest[1:] if rest and rest[0] == "-" else rest)

    def shell(self, name: str, args: list, stdin, piped: bool) -> None:
        """bash -c 'script', or a script on standard input, is read like the command itself."""
        k = 0
        while k < len(args) and args[k].startswith(("-", "+")):
            if "c" in args[k][1:] and not args[k].startswith("--"):
                script = args[k + 1] if k + 1 < len(args) else make_word("")
                if script.expands:
                    self.ask(f"runs a {name} script known only when it runs")
                return self.script(script)
            k += 2 if args[k] in ("-o", "+o", "-O", "+O") else 1
        if k < len(args) and args[k] in STDIN_NAMES:
            return self.script(stdin) if stdin is not None else self.ask(
                f"runs a {name} script from its input, which cannot be checked")
        if k < len(args) and args[k].startswith(("/dev/fd/", "/proc/self/fd/")):
            return self.ask(f"runs a {name} script made when it runs "
                            f"({args[k]}: a <(...) or a pipe)")
        if k < len(args):
            return self.check_operands(args[k:])  # a script file: only where it is can be checked
        if stdin is not None:
            return self.script(stdin)
        if piped:
            self.ask(f"runs a {name} script from its input, which cannot be checked")

    def run_source(self, args: list, stdin=None) -> None:
        """. file: the file runs in this shell; one made when it runs (<(...)) cannot be
        checked."""
        made = args and args[0].startswith(("/dev/fd/", "/proc/self/fd/"))
        if args and (args[0] in STDIN_NAMES or made):
            return self.ask(f"runs a script made when it runs (. {args[0]})")
        self.check_operands(args)

    def run_trap(self, args: list) -> None:
        """trap 'command' EXIT: the command runs later, in this shell."""
        if args and not args[0].startswith("-"):
            self.script(args[0])

    def run_eval(self, args: list) -> None:
        if any(word.expands for word in args):
            self.ask("evaluates text known only when it runs (eval)")
        self.script(" ".join(args))

    def run_cd(self, args: list) -> None:
        target = args[0] if args else make_word(self.home)
        self.check_path(target)
        if not target.expands and target != "-":
            self.cwd = self.path(target)

    run_pushd = run_cd

    def run_find(self, args: list) -> None:
        """find's folders are read; -delete deletes; -exec runs a command on each file found."""
        k = 0
        while k < len(args) and (args[k] in ("-H", "-L", "-P") or args[k].startswith("-O")):
            k += 1  # find's own options come before its folders
        first = k
        while k < len(args) and not args[k].startswith(("-", "(", "!")):
            self.check_path(args[k])
            k += 1
        if any(w in ("-L", "-follow") for w in args):
            self.links_out(args[first:k] or [make_word(".")], "find follows links")
        while k < len(args):
            if args[k] == "-delete":
                self.ask("deletes files (find -delete)")
            elif args[k] in ("-exec", "-execdir", "-ok", "-okdir"):
                end = next((j for j in range(k + 1, len(args)) if args[j] in (";", "+")),
                           len(args))
                run = args[k + 1:end]
                self.command([make_word(w, expands=True) if w == "{}" else w for w in run])
                k = end
            elif args[k] in ("-fprint", "-fprint0", "-fprintf", "-fls") and k + 1 < len(args):
                self.check_write(args[k + 1], overwrite=True, how=f"find {args[k]}")
            k += 1

    def run_git(self, args: list) -> None:
        """The git commands that throw work away, or publish it, ask."""
        k = 0
        while k < len(args) and args[k].startswith("-"):
            if args[k] in ("-C", "--git-dir", "--work-tree") and k + 1 < len(args):
                self.check_path(args[k + 1])
            elif args[k].startswith(("--git-dir=", "--work-tree=")):
                self.check_path(make_word(args[k].split("=", 1)[1], args[k].expands))
            k += 2 if args[k] in ("-C", "-c", "--git-dir", "--work-tree") else 1
        sub, rest = (args[k], args[k + 1:]) if k < len(args) else ("", [])
        flags = set(rest)
        paths = [w for w in rest if not w.startswith("-") and os.path.exists(self.path(w))]
        forced = any(re.match(r"^-[a-z]*f", w) for w in rest)
        discards = {"clean": True, "rm": True, "push": True,
                    "restore": "--staged" not in flags or "--worktree" in flags,
                    "reset": bool(flags & {"--hard", "--merge", "--keep"}),
                    "checkout": bool(flags & {"--", "-f", "--force", "-p", "--patch"} or paths),
                    "switch": bool(flags & {"-f", "--force", "--discard-changes"}),
                    "stash": bool(flags & {"drop", "clear"}),
                    "branch": bool(flags & {"-D", "--delete", "-d", "-M"}),
                    "checkout-index": bool(flags & {"-f", "--force"} or forced)}
        if discards.get(sub):
            self.ask(f"can discard or publish work (git {' '.join([sub, *rest[:3]])})")
        if sub == "apply" and not flags & {"--check", "--stat", "--numstat", "--summary"}:
            self.ask("edits files in place (git apply)")
        values = {k + 1 for k, word in enumerate(rest) if word in ("-m", "--message")}
        self.check_operands([word for k, word in enumerate(rest) if k not in values])

    def run_sed(self, args: list) -> None:
        if any(re.match(r"^-[a-zA-Z]*i", w) and not w.startswith("--")
               or w.startswith("--in-place") for w in args):
            self.ask("edits files in place (sed -i)")
        self.pattern_first("sed", args)

    def run_tee(self, args: list) -> None:
        append = any(w in ("-a", "--append") or re.match(r"^-[ip]*a", w) for w in args)
        for word in args:
            if not word.startswith("-"):
                self.check_write(word, overwrite=not append, how="tee without -a")

    def run_dd(self, args: list) -> None:
        for word in args:
            if word.startswith("of="):
                self.check_write(make_word(word[3:], word.expands), overwrite=True, how="dd of=")
            elif word.startswith("if="):
                self.check_path(make_word(word[3:], word.expands), "reads")

    def run_patch(self, args: list) -> None:
        if "--dry-run" not in args:
            self.ask("edits files in place (patch)")
        self.check_operands(args)

    def pattern_first(self, name: str, args: list) -> None:
        """grep PATTERN FILE..., sed SCRIPT FILE..., awk PROGRAM FILE...: the first operand is
        not a file, unless -e (or -f) gave the pattern already."""
        pattern_flags, file_flags, value_flags = PATTERN_FIRST[name]
        files, pattern_given, k = [], False, 0
        while k < len(args):
            word = args[k]
            if word in pattern_flags | file_flags | value_flags and k + 1 < len(args):
                pattern_given = pattern_given or word in pattern_flags | file_flags
                files += [args[k + 1]] if word in file_flags else []
                k += 2
                continue
            if not word.startswith("-") or word == "-":
                files += [word] if pattern_given else []
                pattern_given = True
            k += 1
        self.check_operands(files)
        if any(w in ("-R", "--dereference-recursive", "-L", "--follow")
               or re.match(r"^-[a-zA-Z]*R", w) for w in args):
            self.links_out(files or [make_word(".")], f"{name} follows links")

    def links_out(self, folders: list, how: str) -> None:
        """A recursive read that follows links: a link in the tree that leads outside asks."""
        seen = 0
        for folder in [self.path(w) for w in folders if not w.expands]:
            for path, what in walk_tree(str(folder)):  # no recursion: a tree may nest 1,000 deep
                seen += 1
                if seen > COPY_WALK_LIMIT:
                    return
                if isinstance(what, OSError):  # what it holds is unknown: said, not passed over
                    return self.ask(f"reads {os.path.relpath(path, self.top)}, a folder that could "
                                    f"not be looked into for links out of the workspace ({how})")
                if what != FOLDER and os.path.islink(path) and self.outside(make_word(path)):
                    return self.ask(f"reads {os.path.relpath(path, self.top)}, a link out of the "
                                    f"workspace ({how})")

    def output_option(self, name: str, args: list) -> None:
        """sort -o FILE, curl -o FILE, wget -O FILE write FILE."""
        flags = OUTPUT_OPTIONS[name]
        for k, word in enumerate(args):
            if word in flags and k + 1 < len(args):
                self.check_write(args[k + 1], overwrite=True, how=f"{name} {word}")
            elif word.startswith(flags[1] + "="):
                self.check_write(make_word(word.split("=", 1)[1], word.expands), overwrite=True,
                                 how=f"{name} {flags[1]}")
        self.check_operands([word for k, word in enumerate(args)
                             if not (k and args[k - 1] in flags)])
