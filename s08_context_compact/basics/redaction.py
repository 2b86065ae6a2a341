"""Secrets: which values must never leave the program, and how they are taken out in
every form they take on the way out: as they are, JSON-escaped (once or twice, with and
without ensure_ascii), spread over numbered lines, or cut at an edge the program made.

Machinery the chapter does not need: one Redactor is built from the secrets at start-up.
Content is redacted with it where it enters the history, before anything is cut, and again
as a last net wherever it is sent, written or shown. This module says what a secret is and
does the replacing.
"""

import base64
import difflib
import json
import re
from functools import lru_cache

from .surrogates import well_formed

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^:/@\s]*:([^@/\s]{8,})@", re.IGNORECASE)
# The program's own settings: a request carries the model's id, so these are not secrets.
SETTINGS_NAMES = ("MODEL_ID", "ANTHROPIC_BASE_URL", "CONTEXT_WINDOW", "API_CONNECT_TIMEOUT",
                  "API_IDLE_TIMEOUT", "CACHE_TTL", "S08_HISTORY")
REDACTED = "[redacted]"
MIN_SECRET = 8                      # shorter values, and shorter pieces of a secret, do not count
LINE_BREAK = re.compile(r"\r\n|\r|\n")
# read_file's (and cat -n's) "    12\t" after a break
NUMBERED = r"(?:[ ]{{0,12}}\d{{1,12}}{tab})?"
# How a text looks inside JSON text: json.dumps without its quotes, with and without
# ensure_ascii, applied once or twice (a JSON file read by a tool, then logged).
ESCAPE = {"raw": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
          "ascii": lambda s: json.dumps(s)[1:-1]}
ENCODINGS = ((), ("raw",), ("ascii",), ("raw", "raw"), ("raw", "ascii"), ("ascii", "raw"))
# The notes the program writes where it cut a text: "…" (one_line), " [line cut at ...]"
# (read_file), " [... cut to fit ...]" (summaries), "\n[... cut here" (restored files),
# "\n[... N bytes of output omitted" (bash). A piece of a secret against one is a cut secret.
CUT_AFTER = re.compile(r"…|[ \n]\[(?:\.\.\.|line cut)")
CUT_BEFORE = re.compile(r"(?:…|\.\.\.\]\n)\Z")


def secret_values(environ, dotenv_files: tuple = ()) -> list:
    """What must never reach the model, a log or a file, longest first: values of
    environment variables named like secrets; every value of 8 or more characters in the
    workspace's .env files (this program's own settings aside); and the password of any
    user:password@host URL among all of them. A value of several lines counts whole, and
    so does each of its lines of 8 or more characters (Redactor)."""
    values = {v.strip() for k, v in environ.items()
              if SECRET_NAME.search(k) and len(v.strip()) >= MIN_SECRET}
    urls = set(environ.values())  # ANTHROPIC_BASE_URL may carry a proxy's password
    for found in dotenv_files:
        values |= {v.strip() for k, v in found.items()
                   if v and len(v.strip()) >= MIN_SECRET and k not in SETTINGS_NAMES}
        urls |= {v for v in found.values() if v}
    values |= {m for v in values | urls for m in URL_PASSWORD.findall(v)}
    return sorted(values, key=len, reverse=True)


# where a wrapped form may be broken: any 16 columns hold a whole atom
WRAP = r"(?:\r?\n)?"


def shell_forms(value: str) -> set:
    """How one shell command can print a secret so its plain form is gone: reversed (rev),
    as hex (xxd -p, od -An -tx1 without spaces, in either case), and as base64 (the groups
    that hold only the secret's bytes, wherever it starts in what was encoded). Pieces
    shorter than MIN_SECRET are left out: too many ordinary words would match."""
    data = value.encode("utf-8", "surrogatepass")
    forms = {value[::-1], data.hex(), data.hex().upper()}
    for offset in range(3):
        text = base64.b64encode(b"\0" * offset + data).decode()
        forms.add(text[(offset + 2) // 3 * 4:(offset + len(data)) // 3 * 4])
    return {form for form in forms if len(form) >= MIN_SECRET}


def encoded(text: str, encoding: tuple) -> str:
    for step in encoding:
        text = ESCAPE[step](text)
    return text


class Redactor:
    """Every secret in every form it can take on the way out, built once from the values.

    A form is a secret as it is, or JSON-escaped (ENCODINGS), its line breaks as CRLF, LF
    or CR and optionally followed by a line number (a file read with read_file), or with
    each run of white space made one space (a preview, one_line). Each line of 8 or more
    characters of a secret of several lines is a secret too, so a read that starts or
    stops inside a key shows none of it. Pieces of 8 or more characters are caught where
    the program cut the text (CUT_AFTER, CUT_BEFORE); everywhere else only whole forms and
    lines are, so a word a secret starts with is not taken out of code."""

    def __init__(self, secrets=()):
        # A value with bytes that are not UTF-8 (from the environment): looked for as text shows it
        secrets = [well_formed(value).strip() for value in secrets]
        self.values = sorted({v for v in secrets if len(v) >= MIN_SECRET}, key=len, reverse=True)
        forms, self.literals, self.starts, self.reach, short = {}, set(), set(), 0, set()
        # (one_line shows a secret's tabs and line breaks as spaces)
        for value in {form for value in self.values for form in (value, " ".join(value.split()))}:
            lines = LINE_BREAK.split(value)
            if len(lines) > 1:
                pieces = [line.strip() for line in lines if len(line.strip()) >= MIN_SECRET]
            else:
                pieces = [value]
            for encoding in ENCODINGS:
                self.literals |= {encoded(piece, encoding) for piece in pieces}
                self.starts.add(encoded(value, encoding))  # what a stream holds back the start of
                if len(lines) > 1:
                    source, size = self.whole_form(lines, encoding)
                    forms[source], self.reach = size, max(self.reach, size)
                    # no line is long enough to count alone: the longest finds the whole
                    if not pieces:
                        short.add(encoded(max(lines, key=len), encoding))
        for literal in self.literals:
            forms[re.escape(literal)] = len(literal.encode())
            self.reach = max(self.reach, len(literal.encode()))
        self.starts |= self.literals
        wrapped = {form for value in self.values for form in shell_forms(value)}
        # hex and base64 come wrapped at 60 or 76 columns: a line break may fall anywhere
        for form in wrapped:
            forms[WRAP.join(map(re.escape, form))] = size = len(form) + 2 * (len(form) // 16 + 1)
            self.reach = max(self.reach, size)
        # read this far past a cut, and a secret across it is whole
        self.reach += MIN_SECRET if forms else 0
        self.atoms = short | {literal[:MIN_SECRET] for literal in self.literals} | \
            {literal[-MIN_SECRET:] for literal in self.literals} | \
            {form[k:k + MIN_SECRET] for form in wrapped
             for k in range(0, len(form) - MIN_SECRET + 1, MIN_SECRET)}
        self.atoms_bytes = [atom.encode() for atom in self.atoms]
        # the longest form wins where several start
        ordered = "|".join(sorted(forms, key=forms.get, reverse=True))
        self.pattern = re.compile(ordered) if forms else None
        self.pattern_bytes = re.compile(ordered.encode()) if forms else None

    @staticmethod
    def whole_form(lines: list, encoding: tuple) -> tuple:
        """A secret of several lines as a pattern (any line break, a line number after it may
        be), and the most bytes it can match."""
        breaks = sorted({encoded(b, encoding) for b in ("\r\n", "\r", "\n")},
                        key=len, reverse=True)
        tab = encoded("\t", encoding)
        between = f"(?:{'|'.join(map(re.escape, breaks))})" + NUMBERED.format(tab=re.escape(tab))
        parts = [encoded(line, encoding) for line in lines]
        longest_break = len(breaks[0]) + 24 + len(tab)
        size = sum(len(p.encode()) for p in parts) + (len(parts) - 1) * longest_break
        return between.join(map(re.escape, parts)), size

    @staticmethod
    def of(secrets) -> "Redactor":
        """secrets as a Redactor: itself, or one built from a list of values (once per list)."""
        return secrets if isinstance(secrets, Redactor) else built(tuple(secrets))

    def __bool__(self) -> bool:
        return bool(self.values)

    def may_hold(self, text: str) -> bool:
        """Whether text may hold a secret or a piece of one: every form and every piece of 8
        or more characters contains one of the atoms (quick, for the many texts that do not)."""
        return any(atom in text for atom in self.atoms)

    def redact(self, text: str, cut_end: bool = False) -> str:
        """text with every secret replaced, and every piece of one at an edge the program cut
        (cut_end: the end of text is such an edge)."""
        if not self.values or not self.may_hold(text):
            return text
        return self.cut_pieces(self.pattern.sub(REDACTED, text), cut_end)

    def redact_lines(self, lines: list) -> list:
        """Lines (of a file being read) with every secret replaced, one spread over several
        lines included; as many lines come back, so line numbers stay true."""
        text = "\n".join(lines)
        if not self.values or not self.may_hold(text):
            return lines
        text = self.pattern.sub(lambda m: "\n".join([REDACTED] * (m.group().count("\n") + 1)),
                                text)
        return self.cut_pieces(text).split("\n")

    def redact_bytes(self, data: bytes) -> bytes:
        """The same for raw bytes (a command's output as it streams)."""
        if not self.values or not any(atom in data for atom in self.atoms_bytes):
            return data
        return self.pattern_bytes.sub(REDACTED.encode(), data)

    def redact_deep(self, value):
        """A JSON value with every secret in its strings replaced. What holds no secret comes
        back as the same object, so a clean history is walked, not copied."""
        if not self.values:
            return value
        if isinstance(value, str):
            return self.redact(value) if len(value) >= MIN_SECRET else value
        if isinstance(value, dict):
            items = {key: self.redact_deep(item) for key, item in value.items()}
            return value if all(items[key] is item for key, item in value.items()) else items
        if isinstance(value, list):
            items = [self.redact_deep(item) for item in value]
            return value if all(new is old for new, old in zip(items, value)) else items
        return value

    def json_text(self, value) -> str:
        """json.dumps(value, ensure_ascii=False) with no secret in it, in any form: its
        strings are redacted, then the text itself (redact_serialized)."""
        return self.redact_serialized(json.dumps(self.redact_deep(value), ensure_ascii=False))

    def redact_json(self, value):
        """A JSON value (a request, messages to save) whose serialized text holds no secret in
        any form, checked on the text as it will be written or sent."""
        clean = self.redact_deep(value)
        text = json.dumps(clean, ensure_ascii=False)
        last = self.redact_serialized(text)
        try:
            return clean if last is text else json.loads(last)
        except ValueError:
            # a match outside a string (a number, say): the strings are clean already
            return clean

    def redact_serialized(self, text: str) -> str:
        """The last net over JSON text: every form of every secret replaced, where it starts
        outside an escape sequence (a match after an odd run of backslashes is not a secret's
        start, and replacing it would break the JSON)."""
        if not self.values or not self.may_hold(text):
            return text
        out, done = [], 0
        for match in self.pattern.finditer(text):
            start = before = match.start()
            while before and text[before - 1] == "\\":
                before -= 1
            if (start - before) % 2 == 0:
                out += [text[done:start], REDACTED]
                done = match.end()
        return "".join(out) + text[done:] if out else text

    def cut_pieces(self, text: str, cut_end: bool = False) -> str:
        """Replace each piece of 8 or more characters of a secret's line that the program cut:
        a start of one right before CUT_AFTER (or the end, when cut_end), an end of one right
        after CUT_BEFORE."""
        for literal in self.literals:
            text = self.cut_heads(text, literal, cut_end)
            text = self.cut_tails(text, literal)
        return text

    @staticmethod
    def cut_heads(text: str, literal: str, cut_end: bool) -> str:
        at = text.find(literal[:MIN_SECRET])
        while at != -1:
            n = MIN_SECRET
            while n < len(literal) and at + n < len(text) and text[at + n] == literal[n]:
                n += 1
            end = at + n
            if n < len(literal) and ((cut_end and end == len(text)) or CUT_AFTER.match(text, end)):
                text = text[:at] + REDACTED + text[end:]
            at = text.find(literal[:MIN_SECRET], at + 1)
        return text

    @staticmethod
    def cut_tails(text: str, literal: str) -> str:
        at = text.find(literal[-MIN_SECRET:])
        while at != -1:
            end, n = at + MIN_SECRET, MIN_SECRET
            while n < len(literal) and end - n > 0 and text[end - n - 1] == literal[-n - 1]:
                n += 1
            start = end - n
            if n < len(literal) and CUT_BEFORE.search(text, 0, start):
                text, at = text[:start] + REDACTED + text[end:], start
            at = text.find(literal[-MIN_SECRET:], at + 1)
        return text

    def stream(self) -> "HeldBack":
        return HeldBack(self)

    def open_start(self, text: str) -> int:
        """Where the end of text may be the start of a secret still arriving (len(text) if
        nowhere): the earliest point from which the rest is a proper start of some form."""
        first = len(text)
        for form in self.starts:
            at = text.find(form[0], max(len(text) - len(form) + 1, 0))
            while at != -1 and at < first:
                if form.startswith(text[at:]):
                    first = at
                    break
                at = text.find(form[0], at + 1)
        return first


@lru_cache(maxsize=16)
def built(values: tuple) -> Redactor:
    return Redactor(values)


class HeldBack:
    """Text that arrives in pieces (the model's reply as it streams), passed on with every
    secret replaced: the end of a piece that may be the start of a secret is held back
    until the next piece shows whether it is one."""

    def __init__(self, redactor: Redactor):
        self.redactor, self.held = redactor, ""

    def feed(self, piece: str) -> str:
        if not self.redactor:
            return piece
        text = self.held + piece
        keep = self.redactor.open_start(text)
        # a whole secret across that point goes whole
        if keep < len(text) and self.redactor.may_hold(text):
            across = [m.start() for m in self.redactor.pattern.finditer(text)
                      if m.start() < keep < m.end()]
            keep = min([keep] + across)
        self.held = text[keep:]
        return self.redactor.redact(text[:keep])

    def finish(self) -> str:
        """What is still held back, the stream having ended there (it is a cut edge)."""
        text, self.held = self.held, ""
        # all of it the start of one
        if len(text) >= MIN_SECRET and self.redactor.open_start(text) == 0:
            return REDACTED
        return self.redactor.redact(text, cut_end=True)


def redact(text: str, secrets) -> str:
    """text with every secret replaced; secrets is a Redactor, or the values themselves."""
    return Redactor.of(secrets).redact(text)


# ---- the placeholder written back ---------------------------------------------------------------
# The model sees a secret as [redacted]. When it writes a file back whole, or edits near a
# secret, its text holds the placeholder where the file holds the real value: written as
# it is, the user's key on disk would become the word "[redacted]".

def secrets_of_line(secrets: Redactor, shown: str, original: str) -> list | None:
    """The secrets a line held where its shown form has [redacted], in order; None if the
    two do not line up."""
    pattern = "(.+?)".join(map(re.escape, shown.split(REDACTED)))
    found = re.fullmatch(pattern, original, re.S)
    if not found or any(secrets.redact(value) != REDACTED for value in found.groups()):
        return None
    return list(found.groups())


def fill_placeholders(line: str, values: list) -> str:
    parts = line.split(REDACTED)
    return parts[0] + "".join(value + part for value, part in zip(values, parts[1:]))


def put_back(secrets: Redactor, text: str, original: str) -> str | None:
    """text as the model wrote it over original, each [redacted] it copied from what it was
    shown replaced by the secret it stands for: a line it kept gets that line's secrets, a
    changed part the secrets of the part it replaced, in order, when it has as many
    placeholders (or they all stand for one value). None when a placeholder cannot be
    placed: writing it would lose a value. Where original held no secret, [redacted] is the
    model's own text and stays. Line endings are the text's own."""
    if REDACTED not in text or not secrets or not original:
        return text
    originals = [line.rstrip("\r") for line in original.split("\n")]
    shown = secrets.redact_lines(originals)
    if shown == originals:
        return text
    lines = text.split("\n")
    keys = [line.rstrip("\r") for line in lines]
    out = []
    matcher = difflib.SequenceMatcher(None, shown, keys, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        new = lines[j1:j2]
        wanted = sum(line.count(REDACTED) for line in new)
        if not wanted:
            out += new
            continue
        values = [secrets_of_line(secrets, s, o) for s, o in zip(shown[i1:i2], originals[i1:i2])]
        if any(v is None for v in values):
            return None
        values = [value for line_values in values for value in line_values]
        if len(values) != wanted and len(set(values)) != 1:
            return None
        values = values if len(values) == wanted else values[:1] * wanted
        for line in new:
            count = line.count(REDACTED)
            out.append(fill_placeholders(line, values[:count]))
            values = values[count:]
    return "\n".join(out)
