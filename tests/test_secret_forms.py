"""Secrets in every form they take on the way out: with a quote and a backslash, a tab,
Chinese characters, or several lines (a key); JSON-escaped, numbered by read_file, split
over streamed chunks, cut at every edge the program makes. No secret, and no piece of 8
characters or more of one, may leave the program: not in a request, the session log, a
transcript, a saved output, the history file, or on the screen."""

import base64
import hashlib
import json
import shlex
from functools import lru_cache

import pytest

from conftest import blocks, run_cli
from s08_context_compact.offline.fake_anthropic import text, tool_uses
from s08_context_compact.basics.redaction import REDACTED, Redactor
from s08_context_compact.basics import workspace_files as workspace_files
from s08_context_compact.compaction.summary import restored_files
from s08_context_compact.basics import one_line
from s08_context_compact.compaction import Store
from s08_context_compact.endpoint import model_reply

QUOTED = 'Pa"ss\\w0rd-Xy9Q'             # a quote and a backslash: JSON escapes both
TABBED = "tab\tsecret-Rk8vW2"            # a tab: JSON escapes it, the screen expands it
CHINESE = "密码是一个很长的秘密值啊"      # not ASCII: \u escapes with ensure_ascii
PLAIN = "sk-live-4f9Q2xZp7LmN0bVc"       # 24 characters
KEY_BODY = [base64.b64encode(hashlib.sha256(b"line %d" % n).digest() * 2)[:64].decode() for n in range(12)]
DEPLOY_KEY = "\n".join(["-----BEGIN S08 TEST KEY-----", *KEY_BODY, "Zq4=", "-----END S08 TEST KEY-----"])
SHAPES = {"quote and backslash": QUOTED, "tab": TABBED, "chinese": CHINESE, "plain": PLAIN, "key of lines": DEPLOY_KEY}
DOTENV = f"DB_PASSWORD='{QUOTED}'\nAPI_SECRET={CHINESE}\nDEPLOY_KEY=\"{DEPLOY_KEY}\"\nAPP_NAME=demo\n"
KEY_FIRST = 3                            # the line of .env where the key starts; it ends 14 lines later


@lru_cache(maxsize=None)
def pieces(secret: str) -> tuple:
    """The secret and every 8-character piece of it, as they are and JSON-escaped (with and
    without ensure_ascii): (those 8 characters long, the others)."""
    subs = {secret} | {secret[i:i + 8] for i in range(len(secret) - 7)}
    forms = {f for s in subs for f in (s, json.dumps(s, ensure_ascii=False)[1:-1], json.dumps(s)[1:-1])}
    return {f for f in forms if len(f) == 8}, {f for f in forms if len(f) != 8}


def leaks(secret: str, haystacks: dict) -> list:
    """Where any piece of the secret shows, as (where, piece); haystacks maps a place to
    (its text, the set of its 8-character pieces)."""
    eights, others = pieces(secret)
    found = []
    for where, (hay, grams) in haystacks.items():
        found += [(where, piece) for piece in sorted(grams & eights)[:3]]
        found += [(where, piece) for piece in others if piece in hay][:3]
    return found


def with_grams(texts: dict) -> dict:
    return {where: (hay, {hay[i:i + 8] for i in range(len(hay) - 7)}) for where, hay in texts.items()}


def make_workspace(workspace):
    (workspace / ".env").write_text(DOTENV, encoding="utf-8")
    config = [f"DB_PASSWORD = '{QUOTED}'", f"TOKEN = \"{TABBED}\"", f"名字 = '{CHINESE}'", f"KEY = {PLAIN}",
              "AS_JSON = " + json.dumps(list(SHAPES.values())), "AS_TEXT = " + json.dumps(list(SHAPES.values()),
                                                                                          ensure_ascii=False)]
    (workspace / "config.py").write_text("\n".join(config) + "\n", encoding="utf-8")
    long_lines = ["x" * (2000 - n) + secret + "y" * 50 for n, secret in enumerate((PLAIN, QUOTED, CHINESE, TABBED), 3)]
    (workspace / "long.txt").write_text("\n".join(long_lines) + "\n", encoding="utf-8")
    (workspace / "dense.txt").write_text(((PLAIN + " ") * 40 + "\n") * 30)  # every cut lands inside one


def test_no_piece_of_any_secret_leaves_the_program(fake, workspace):
    make_workspace(workspace)
    # a copy under another name: a command that names .env itself asks first (test_nothing_lost.py)
    (workspace / "env_copy.txt").write_bytes((workspace / ".env").read_bytes())
    said = " | ".join(SHAPES.values())  # the model repeats every secret, in its text and its tool inputs
    fake.reply(tool_uses([("read_file", {"path": "config.py"}),
                          ("read_file", {"path": ".env", "offset": KEY_FIRST + 3, "limit": 4}),  # inside the key
                          ("read_file", {"path": ".env", "limit": KEY_FIRST}),                   # to its first line
                          ("read_file", {"path": ".env", "offset": KEY_FIRST + 12}),             # from near its end
                          ("read_file", {"path": ".env"}),
                          ("read_file", {"path": "long.txt"}),                                   # lines cut at 2,000
                          ("read_file", {"path": "dense.txt"}),
                          ("bash", {"command": "cat dense.txt dense.txt; seq 1 25000; cat -n env_copy.txt config.py"}),
                          ("bash", {"command": "echo " + shlex.quote(said)}),
                          ("bash", {"command": "echo " + "x" * 105 + PLAIN}),  # the ledger keeps 120 characters
                          ("write_file", {"path": "notes.txt", "content": said})], preface=f"I see {said}."),
               text(f"Here they are again: {said}"), text("All done."))
    fake.summary(text(f"<summary>The user's secrets are {said}.</summary>"))
    done = run_cli(fake, workspace, f"remember {QUOTED} {TABBED} {CHINESE} {PLAIN}\n/compact\ngo on\n",
                   SERVICE_TOKEN=TABBED, MY_SERVICE_TOKEN=PLAIN)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    sent = [body.decode() for body in fake.bodies]
    haystacks = {f"request {n}": body for n, body in enumerate(sent)}
    haystacks |= {str(path.relative_to(workspace)): path.read_text(encoding="utf-8", errors="replace")
                  for folder in (".transcripts", ".task_outputs") for path in (workspace / folder).rglob("*")
                  if path.is_file()}
    haystacks |= {"stdout": done.stdout, "stderr": done.stderr}
    haystacks = with_grams(haystacks)
    found = {shape: leaks(secret, haystacks) for shape, secret in SHAPES.items()}
    assert not any(found.values()), {shape: where for shape, where in found.items() if where}
    # ...and the work happened: every place above was really written, with the secrets redacted
    assert fake.summary_requests and list(workspace.glob(".transcripts/compact-*.jsonl"))
    assert list(workspace.glob(".transcripts/session-*.jsonl"))
    assert list(workspace.glob(".task_outputs/tool-results/*.txt")), "the big output was saved"
    assert "re-read from disk" in sent[-1] and REDACTED in sent[-1], "the files came back after the summary"
    results = [b["content"] for b in blocks(fake.main_requests[1]["messages"][-1]) if b.get("type") == "tool_result"]
    assert f"{KEY_FIRST + 3:>6}\\t{REDACTED}" in json.dumps(results[1]), "line numbers stay true"
    assert "[line cut at 2000 chars]" in results[5]
    assert (workspace / "notes.txt").read_text() == said, "tool inputs run as the model wrote them"
    assert "I see [redacted] | [redacted]" in done.stdout


# ---------------------------------------------------------------- each form, each cut, in-process

REDACTOR = Redactor(SHAPES.values())


def assert_no_piece(shown: str, *secrets) -> None:
    haystack = with_grams({"shown": shown})
    found = [piece for secret in secrets or SHAPES.values() for _, piece in leaks(secret, haystack)]
    assert not found, (found, shown[:300])


def forms_of(secret: str) -> list:
    """The secret as it can meet the program: as is, JSON-escaped once and twice, with CRLF
    line breaks, numbered as read_file and cat -n number lines, and on one line (one_line)."""
    once = [json.dumps(secret, ensure_ascii=False)[1:-1], json.dumps(secret)[1:-1]]
    numbered = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(secret.split("\n"), start=7))
    return [secret, *once, *(json.dumps(f)[1:-1] for f in once), secret.replace("\n", "\r\n"), numbered,
            " ".join(secret.split())]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_form_of_a_secret_is_redacted_as_text_bytes_and_json(shape):
    for n, form in enumerate(forms_of(SHAPES[shape])):
        text = f"before {form} after"
        assert REDACTED in REDACTOR.redact(text)
        assert_no_piece(REDACTOR.redact(text))
        assert_no_piece(REDACTOR.redact_bytes(text.encode()).decode())
        assert_no_piece(REDACTOR.json_text({"record": [text]}))
        if n < 3:  # the last net over JSON text alone knows what one more escaping makes of these
            for ascii in (False, True):
                line = json.dumps({"record": text}, ensure_ascii=ascii)
                assert_no_piece(json.loads(REDACTOR.redact_serialized(line))["record"])  # still JSON, and clean


def test_a_key_is_recognised_whole_across_numbered_lines_short_lines_included():
    numbered, crlf = forms_of(DEPLOY_KEY)[-1], DEPLOY_KEY.replace("\n", "\r\n")
    assert "Zq4=" in numbered  # a line too short to count alone...
    for form in (numbered, crlf, json.dumps(numbered)[1:-1]):
        redacted = REDACTOR.redact(form)
        assert redacted.count(REDACTED) == 1 and "Zq4" not in redacted, redacted  # ...goes with the rest


def test_a_match_inside_an_escape_sequence_is_not_a_secret():
    redactor = Redactor(["nABCDEFGH"])  # "\n" + "ABCDEFGH" in JSON text is not this secret
    line = json.dumps({"text": "x\nABCDEFGH y nABCDEFGH"})
    assert json.loads(redactor.redact_serialized(line)) == {"text": f"x\nABCDEFGH y {REDACTED}"}


@pytest.mark.parametrize("shape", [s for s in SHAPES if "\n" not in SHAPES[s]])
def test_read_file_cuts_a_long_line_only_after_redacting_it(shape, workspace):
    secret = SHAPES[shape]
    lines = ["x" * (workspace_files.READ_MAX_LINE_CHARS - k) + secret + "y" * 20 for k in range(1, len(secret))]
    (workspace / "long.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    shown = workspace_files.read_lines(workspace / "long.txt", "long.txt", 1, 2000, REDACTOR)
    assert shown.count("[line cut at") == len(lines)
    assert_no_piece(shown, secret)


def test_read_file_shows_no_line_of_a_key_whatever_the_offset_and_limit(workspace):
    (workspace / ".env").write_text(DOTENV, encoding="utf-8")
    total = DOTENV.count("\n")
    for offset in range(1, total + 1):
        for limit in range(1, total + 2 - offset):
            shown = workspace_files.read_lines(workspace / ".env", ".env", offset, limit, REDACTOR)
            assert_no_piece(shown)
            assert shown.count("\n") == limit - 1 + ("[more lines follow" in shown), "one line a line, numbers kept"


def test_files_restored_after_a_summary_are_cut_only_after_redacting(s08, make_agent, workspace):
    agent = make_agent(secrets=REDACTOR)
    room = 60  # tokens: restored_files reads four bytes a token from disk, then cuts to the room
    for secret in (PLAIN, CHINESE):  # one byte a character, and three
        period = len((secret + " ").encode())
        for shift in range(period):  # each puts the cut at another byte of a secret
            filler = "a" * (room * 4 - 2 * period + shift)
            (workspace / "f.txt").write_text(filler + (secret + " ") * 12, encoding="utf-8")
            agent.ledger.reads.clear()
            agent.ledger.note_read("f.txt", workspace / "f.txt")
            restored = restored_files(agent.ledger.reads, agent.workdir, agent.secrets, room,
                                      agent.settings.restore_file_tokens)
            assert len(restored) == 1 and "cut here" in restored[0]
            assert_no_piece(restored[0])


@pytest.mark.parametrize("shape", SHAPES)
def test_a_streamed_secret_is_held_back_until_whole_wherever_the_chunks_split(shape):
    said = f"it is {SHAPES[shape]} ok"
    for cut in range(1, len(said), 1 if len(said) < 100 else 7):  # the key: a cut every 7 characters
        stream = REDACTOR.stream()
        shown = stream.feed(said[:cut]) + stream.feed(said[cut:]) + stream.finish()
        assert shown == f"it is {REDACTED} ok"
        stream = REDACTOR.stream()  # the stream stops here (Ctrl-C): what was held is a cut secret
        assert_no_piece(stream.feed(said[:cut]) + stream.finish())


@pytest.mark.parametrize("mark", ["…", " [line cut at 2000 chars]", " [... cut to fit ...]",
                                  "\n[... cut here; read_file shows the rest]"])
def test_a_piece_of_a_secret_at_a_cut_the_program_made_is_redacted(mark):
    for secret in (PLAIN, QUOTED, CHINESE, KEY_BODY[3]):
        for n in range(8, len(secret)):
            assert_no_piece(REDACTOR.redact(f"said {secret[:n]}{mark}"))
    tail = f"[... 10 bytes of output omitted ...]\n{PLAIN[-12:]} and so on"
    assert REDACTOR.redact(tail) == f"[... 10 bytes of output omitted ...]\n{REDACTED} and so on"


def test_the_start_of_a_secret_is_not_taken_out_of_ordinary_text():
    redactor = Redactor(["postgres://app:pw-7f3k9q@db.internal:5432/prod"])
    for said in ("connect to postgres://localhost", "postgres://localhost:5432/prod is the default"):
        assert redactor.redact(said) == said


def test_a_preview_on_screen_is_redacted_even_where_it_is_cut(s08, make_agent):
    agent = make_agent(secrets=REDACTOR)
    for n in range(60, 95):
        agent.say(one_line("x" * n + PLAIN + QUOTED, 90), cut=True)
    assert_no_piece(agent.out.text)


def test_the_history_file_keeps_no_form_of_a_secret(tmp_path):
    readline = pytest.importorskip("readline")
    from s08_context_compact.command_line.repl import save_history
    readline.clear_history()
    for secret in (QUOTED, TABBED, CHINESE, PLAIN):
        readline.add_history(f"remember {json.dumps(secret)} and {secret}")
    save_history(readline, tmp_path / "history", REDACTOR)
    readline.clear_history()
    saved = (tmp_path / "history").read_text(encoding="utf-8")
    assert saved.count(REDACTED) == 8
    assert_no_piece(saved)


def test_the_last_nets_catch_every_form_in_what_is_sent_logged_and_saved(s08, make_agent, fake, workspace):
    from s08_context_compact.endpoint.model_calls import count_tokens
    from s08_context_compact.session.session_log import SessionLog
    said = " ".join(f"<{form}>" for secret in SHAPES.values() for form in forms_of(secret))
    history = [{"role": "user", "content": [{"type": "text", "text": said}]}]  # as an old, unredacted log had it
    agent = make_agent(secrets=REDACTOR)
    model_reply(agent.connection, s08.build_request(agent, history), 1_000, show_text=False)
    count_tokens(agent.connection, s08.build_request(agent, history), 1_000)
    store = Store(workspace, REDACTOR)
    saved = [store.save_messages(history, "snip", {"summary": said}), store.save_output("toolu_1", said)]
    SessionLog(workspace / "session.jsonl", REDACTOR).message(history[0], prompt=said)
    assert len(fake.bodies) == 2
    for written in [body.decode() for body in fake.bodies] + [(workspace / p).read_text() for p in saved] + \
            [(workspace / "session.jsonl").read_text()]:
        assert_no_piece(written)
        assert written.count(REDACTED) >= 20
