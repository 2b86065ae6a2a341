"""The chapter names the code: every function or constant it mentions must exist in code.py
(a comment does not count), and it names every one of part 1, its excerpts in code.py's
order; every piece of code it quotes is in code.py as quoted; its numbers are the code's. The reference page names only
what exists beside it, and both pages keep their Chinese copies in step."""

import ast
import re
import textwrap

import pytest

from conftest import CODE, ROOT
from s08_context_compact.compaction import settings
from s08_context_compact.compaction import Settings

FOLDER = CODE.parent
CHAPTER = FOLDER / "README.md"
CHAPTER_ZH = FOLDER / "README.zh.md"
REFERENCE = FOLDER / "REFERENCE.md"
REFERENCE_ZH = FOLDER / "REFERENCE.zh.md"
TREE = ast.parse(CODE.read_text(encoding="utf-8"))
CHAPTER_MAX_WORDS = 3_500
# The machinery the chapter does not need, in the folders by role beside code.py (STYLE.md, part 2);
# the demo and the fake API are not the program's machinery. The fake API is a package of its own
# (offline/fake_anthropic/), whose files are not modules of the program.
OFFLINE = ("demo", "fake_anthropic")
MODULE_PATHS = {path.stem: path for path in sorted(FOLDER.rglob("*.py"))
                if path.name not in ("code.py", "__init__.py") and "__pycache__" not in path.parts
                and FOLDER / "offline" / "fake_anthropic" not in path.parents}
MACHINERY = tuple(name for name in MODULE_PATHS if name not in OFFLINE)
# Names of the API, of LiteLLM, and of settings read from the environment.
KNOWN_ELSEWHERE = {"tool_use", "tool_result", "tool_choice", "max_tokens", "input_tokens", "cache_control",
                   "max_input_tokens", "invalid_request_error", "count_tokens", "read_file", "write_file",
                   "edit_file", "todo_write", "load_skill",
                   "NO_COLOR", "CONTEXT_WINDOW", "COMPACT_AT", "MODEL_ID", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                   "POST_COMPACT_", "SKILL", "cache_edits", "tool_use_id", "messages/count_tokens",
                   "redacted_thinking", "ContextWindowExceededError", "stop_reason", "message_delta",
                   "cache_read_input_tokens", "ANTHROPIC_AUTH_TOKEN", "enable_pre_call_checks",
                   "use_chat_completions_url_for_anthropic_messages", "model_info.max_input_tokens",
                   "no_db_connection", "PYTHONPYCACHEPREFIX"}


def words_in_code(tree) -> set:
    """Every identifier code.py uses or defines, and every word of its string literals
    other than docstrings: what a comment says is not there."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node)}
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            words.add(node.name)
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
            words.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
    return words


def module_words(name: str) -> set:
    """The words of a sibling module of code.py, or of code.py itself while that module is
    not split off yet."""
    path = MODULE_PATHS.get(name)
    return words_in_code(ast.parse(path.read_text(encoding="utf-8"))) if path else WORDS


def defined_at(tree) -> dict:
    """Top-level functions, classes and assigned names, with the line that defines them."""
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.setdefault(node.name, node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, node.lineno)
    return found


# The layers' sizes, Settings' fields and defaults (compaction/settings.py), are named as code.py
# reads them.
SETTINGS_TREE = ast.parse(MODULE_PATHS["settings"].read_text(encoding="utf-8"))
SETTINGS_NAMES = set(defined_at(SETTINGS_TREE)) | {node.target.id for node in ast.walk(SETTINGS_TREE)
                                                    if isinstance(node, ast.AnnAssign)} | \
    {node.name for node in ast.walk(SETTINGS_TREE) if isinstance(node, ast.FunctionDef)}  # Settings' methods
WORDS = words_in_code(TREE) | SETTINGS_NAMES
DEFINED_AT = defined_at(TREE)


def code_names(markdown: str) -> set:
    names = set()
    for span in re.findall(r"`([^`\n]+)`", markdown):
        for name in re.findall(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?$", span):
            if "_" in name or re.match(r"[A-Z][a-z]+[A-Z]", name) or name.isupper():
                names.add(name)
    return names


def missing_names(text: str, words: set) -> list:
    """The code names a page mentions that are nowhere to be found. `overflow.context_overflow`
    is looked up in overflow.py; `session_log.py` is a
    file of the chapter's folder or one of the machinery modules."""
    missing = []
    for name in sorted(code_names(text) - KNOWN_ELSEWHERE):
        module, _, attribute = name.rpartition(".")
        if attribute == "py":
            found = module in MODULE_PATHS or (FOLDER / name).exists()
        elif module in MACHINERY:
            found = attribute in module_words(module)
        else:
            found = name.split(".")[-1] in words
        if not found:
            missing.append(name)
    return missing


@pytest.mark.parametrize("chapter", [CHAPTER, CHAPTER_ZH], ids=["en", "zh"])
def test_every_code_name_in_the_chapter_exists(chapter):
    missing = missing_names(chapter.read_text(encoding="utf-8"), WORDS)
    assert not missing, f"{chapter.name} names what code.py does not have: {missing}"


@pytest.mark.parametrize("reference", [REFERENCE, REFERENCE_ZH], ids=["en", "zh"])
def test_every_code_name_in_the_reference_exists(reference):
    """The reference describes the machinery, so its names may live in any module of the folder."""
    words = set().union(*(words_in_code(ast.parse(path.read_text(encoding="utf-8")))
                          for path in sorted(FOLDER.rglob("*.py"))))
    missing = missing_names(reference.read_text(encoding="utf-8"), words)
    assert not missing, f"{reference.name} names what no module has: {missing}"


def test_a_module_prefix_is_looked_up_in_that_module():
    assert missing_names("`endpoint.no_such_function_anywhere`", WORDS) == ["endpoint.no_such_function_anywhere"]
    assert missing_names("`no_where.py` and `session_log.py`", WORDS) == ["no_where.py"]
    assert missing_names("`Settings.for_window` and `tool_result_budget`", WORDS) == []


def ceiling_window(s08) -> int:
    """The smallest window at which the tool-result budget reaches its fixed ceiling."""
    low, high = 4_000, 10_000_000
    while low < high:
        middle = (low + high) // 2
        if Settings.for_window("m", middle).budget_chars >= settings.TOOL_RESULT_BUDGET_CHARS:
            high = middle
        else:
            low = middle + 1
    return low


@pytest.mark.parametrize("chapter", [CHAPTER, CHAPTER_ZH], ids=["en", "zh"])
def test_the_chapter_numbers_match_the_code(s08, chapter):
    text = chapter.read_text(encoding="utf-8")
    big = Settings.for_window("m", 200_000)
    small = Settings.for_window("m", 12_000)
    for number in (big.threshold, big.budget_chars, big.micro_trigger, big.clear_at_least,
                   big.restore_files_tokens, small.threshold, small.budget_chars,
                   small.micro_trigger, small.clear_at_least):
        assert f"{number:,}" in text, number
    assert f"{ceiling_window(s08) / 1000:.1f}k" in text, "the window from which the budget is 200,000 characters"


def test_a_name_only_in_a_comment_or_a_docstring_is_not_in_the_code():
    tree = ast.parse('# uses compact_history here\ndef f():\n    """and keep_going in a docstring"""\n'
                     '    return g("x_y")\n')
    words = words_in_code(tree)
    assert {"f", "g", "x_y"} <= words and "compact_history" not in words and "keep_going" not in words


def section(text: str, heading: str) -> str:
    """The text under a "## " heading, up to the next one."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


PART_2_STARTS = next(n for n, line in enumerate(CODE.read_text(encoding="utf-8").splitlines(), 1)
                     if line.startswith("# ==== PART 2"))
PART_1_FUNCTIONS = [node.name for node in TREE.body if isinstance(node, ast.FunctionDef) and node.lineno < PART_2_STARTS]
PART_1_CONSTANTS = [target.id for node in TREE.body if isinstance(node, ast.Assign) and node.lineno < PART_2_STARTS
                    for target in node.targets if isinstance(target, ast.Name) and target.id.isupper()]


def excerpt_line(block: str, source_lines: list) -> int:
    """Where in code.py an excerpt starts: its first line, which must occur there once."""
    first = next(line for line in block.splitlines() if line.strip() not in ("", "...")).strip()
    found = [n for n, line in enumerate(source_lines) if line.strip() == first]
    assert len(found) == 1, f"the excerpt starting {first!r} is found {len(found)} times in code.py"
    return found[0]


@pytest.mark.parametrize("chapter", [CHAPTER, CHAPTER_ZH], ids=["en", "zh"])
def test_the_chapter_follows_code_py_and_names_every_function_of_part_1(chapter):
    """Read beside code.py, the chapter goes the same way: its excerpts come in code.py's order,
    its layers' sections too, and no function of part 1 goes unnamed."""
    text = chapter.read_text(encoding="utf-8")
    source_lines = CODE.read_text(encoding="utf-8").splitlines()
    starts = [excerpt_line(block, source_lines) for block in python_blocks(text)]
    assert starts == sorted(starts), f"excerpts out of code.py's order, at lines {[n + 1 for n in starts]}"
    unnamed = [name for name in PART_1_FUNCTIONS + PART_1_CONSTANTS if not re.search(rf"\b{name}\b", text)]
    assert len(PART_1_FUNCTIONS) >= 25 and len(PART_1_CONSTANTS) >= 5 and not unnamed, \
        f"part 1 defines, the chapter never names: {unnamed}"
    layers = re.findall(r"^### `(\w+)`", text, re.M)
    assert layers == ["tool_result_budget", "snip_compact", "micro_compact", "compact_history", "reactive_compact"]
    assert [DEFINED_AT[n] for n in layers] == sorted(DEFINED_AT[n] for n in layers)


def imports_of(path) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):  # every part of the path, and the names: a module may be either
            found |= set((node.module or "").split(".")) | {alias.name for alias in node.names}
    return found - {""}


def test_code_py_is_the_lesson_and_main_comes_last():
    """code.py keeps the lesson and ends with main; the machinery lives in sibling modules,
    which never import code.py (its name is also a standard-library module)."""
    functions = [node.name for node in TREE.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    assert functions[-1] == "main", f"code.py defines {functions[functions.index('main') + 1:]} after main"
    assert not [n for n in MACHINERY if not n in MODULE_PATHS], "machinery modules missing"
    moved = {"model_calls": ("Endpoint",), "overflow": ("context_overflow", "learned_window", "OVERFLOW_WORDINGS"),
             "ledger": ("Ledger", "ledger_hooks"), "settings": ("Settings", "TOOL_RESULT_BUDGET_CHARS"),
             "summary": ("replace_with_summary", "what_comes_back", "nothing_to_summarize"),
             "user_turns": ("take_line", "handle_command"), "startup": ("build_system_prompt",),
             "tool_calls": ("run_tool_calls", "answer_call"), "repeat_reads": ("RepeatReads",)}
    for module, names in moved.items():
        assert not [n for n in names if n in DEFINED_AT], f"code.py still defines what {module}.py holds"
        assert all(n in defined_at(ast.parse(MODULE_PATHS[module].read_text(encoding="utf-8"))) for n in names)
    assert not [n for n in MACHINERY if "code" in imports_of(MODULE_PATHS[n])]


def test_part_1_defines_a_name_before_it_uses_it():
    """Read top to bottom, part 1 never sends the reader ahead: each name of code.py a
    definition in part 1 uses is defined above it. Three ways out: part 2's tools (the loop
    runs them), a section a reader may leave for later, and one read from its entry down, as
    the chapter shows it. "Compact before you must", the summary written ahead, is both: the
    plain summary layers take it when one is there, as compact_now reaches it. "What is
    summarized, the summary, what replaces it" opens with summarize_into, then its steps:
    only its own definitions may look ahead in it.
    One meaning per name: no local name hides one of code.py's own."""
    lines = CODE.read_text(encoding="utf-8").splitlines()
    part_2 = next(n for n, line in enumerate(lines, 1) if line.startswith("# ==== PART 2"))

    def section(heading: str) -> tuple:
        start = next(n for n, line in enumerate(lines, 1) if line.startswith(heading))
        return start, next(n for n, line in enumerate(lines[start:], start + 1) if line.startswith("# ----"))

    early, within = section("# ---- compact before you must"), section("# ---- what is summarized")
    ahead, hidden = [], []
    for node in TREE.body:
        if node.lineno > part_2 or not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign)):
            continue
        for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
            at = DEFINED_AT.get(name, 0)
            way_out = (early[0] < at < early[1] and node.lineno < early[1]
                       or within[0] < at < within[1] and within[0] < node.lineno < within[1])
            if name in DEFINED_AT and node.lineno < DEFINED_AT[name] < part_2 and not way_out:
                ahead.append(f"{getattr(node, 'name', 'line %d' % node.lineno)} uses {name}")
        stored = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        hidden += [f"{getattr(node, 'name', node.lineno)}: {name}" for name in stored & set(DEFINED_AT)
                   if not isinstance(node, ast.Assign)]
    assert not ahead, ahead
    assert not hidden, f"local names that hide code.py's own: {hidden}"


SCREEN_LINES = 55  # an editor's window on a laptop


def test_the_summary_reads_on_three_screens():
    """From the summary to the two summary layers (the model's summary, what comes back, the
    new history, compact_history and reactive_compact): what a reader follows on one path, on
    three screens or fewer. The rest of the summary's machinery is compaction/summary.py."""
    lines = CODE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# ---- the summary"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# ---- the summary layers as the pipeline"))
    assert "def compact_history(" in "\n".join(lines[start:end]) and "def reactive_compact(" in "\n".join(lines[start:end])
    assert end - start <= 3 * SCREEN_LINES, f"{end - start} lines"


def test_each_file_stays_short_enough_to_read_and_the_imports_form_no_cycle():
    """code.py holds the lesson in at most 1,000 lines, one clause a line (at most 1% of them over
    100 characters: the size is met by moving machinery out, never by packing); each module is at most 600,
    says first that the chapter does not need it, and the imports between them never loop."""
    lines = CODE.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 1_000
    assert len([line for line in lines if len(line) > 100]) <= len(lines) // 100
    for name in MACHINERY:
        source = MODULE_PATHS[name].read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 600, f"{name}.py is over 600 lines"
        assert "chapter does not need" in " ".join((ast.get_docstring(ast.parse(source)) or "").split()), name
    imports = {name: imports_of(MODULE_PATHS[name]) & set(MACHINERY) for name in MACHINERY}

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in imports[start])
    assert not [name for name in MACHINERY if reaches(name, name)], "an import cycle"


def python_blocks(text: str) -> list:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def quoted_verbatim(block: str, source_lines: list) -> bool:
    """Whether a quoted block is in the source as it stands: after its common indentation is
    stripped, each run of lines between "..." lines matches consecutive source lines, all at
    one further indentation, the runs in order."""
    runs, run = [], []
    for line in textwrap.dedent(block).splitlines():
        if line.strip() == "...":
            runs.append(run)
            run = []
        else:
            run.append(line)
    runs = [r for r in runs + [run] if r]

    def match_from(run_index: int, start: int, indent: str | None) -> bool:
        if run_index == len(runs):
            return True
        lines = runs[run_index]
        for at in range(start, len(source_lines) - len(lines) + 1):
            first = source_lines[at]
            if not first.endswith(lines[0]) or first[:len(first) - len(lines[0])].strip():
                continue
            pad = first[:len(first) - len(lines[0])]
            if indent is not None and pad != indent:
                continue
            if all(source_lines[at + k] == (pad + line if line else "") for k, line in enumerate(lines)) \
                    and match_from(run_index + 1, at + len(lines), pad):
                return True
        return False
    return bool(runs) and match_from(0, 0, None)


def test_quoting_finds_what_is_there_and_only_that():
    source = ["def f(x):", "    a = 1", "    b = 2", "    return a + b", "", "def g():", "    pass"]
    assert quoted_verbatim("def f(x):\n    ...\n    return a + b\n", source)
    assert quoted_verbatim("    a = 1\n    b = 2\n", source)
    assert not quoted_verbatim("def f(x):\n    a = 2\n", source)  # a changed line
    assert not quoted_verbatim("return a + b\n...\ndef f(x):\n", source)  # out of order
    assert not quoted_verbatim("def f(x):\n  a = 1\n", source)  # indentation changed inside the block


@pytest.mark.parametrize("chapter", [CHAPTER, CHAPTER_ZH], ids=["en", "zh"])
def test_every_excerpt_is_in_code_py_as_quoted(chapter):
    blocks = python_blocks(chapter.read_text(encoding="utf-8"))
    assert len(blocks) >= 5, "the chapter shows a piece of the real code for each idea"
    source_lines = CODE.read_text(encoding="utf-8").splitlines()
    stale = [block.splitlines()[0] for block in blocks if not quoted_verbatim(block, source_lines)]
    assert not stale, f"{chapter.name} quotes code that is not in code.py as quoted: {stale}"


def headings(text: str) -> list:
    return [line.split(" ")[0] for line in text.splitlines() if re.match(r"#{1,4} ", line)]


@pytest.mark.parametrize("english, chinese", [(CHAPTER, CHAPTER_ZH), (REFERENCE, REFERENCE_ZH)],
                         ids=["chapter", "reference"])
def test_the_chinese_copy_is_in_step(english, chinese):
    en, zh = english.read_text(encoding="utf-8"), chinese.read_text(encoding="utf-8")
    assert headings(en) == headings(zh), "the same sections, in the same order"
    assert python_blocks(en) == python_blocks(zh), "the same code"
    assert code_names(en) == code_names(zh), "the same names"


def test_the_chapter_is_short_enough_to_read_in_one_sitting():
    words = len(CHAPTER.read_text(encoding="utf-8").split())
    assert words <= CHAPTER_MAX_WORDS, f"{words} words"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.strip().lower()
    return re.sub(r" ", "-", "".join(c for c in text if c.isalnum() or c in " -_"))


PAGES = [CHAPTER, CHAPTER_ZH, REFERENCE, REFERENCE_ZH, ROOT / "README.md"]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_link_between_the_pages_arrives(page):
    text = page.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, page
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), link
        if anchor and path.suffix == ".md":
            anchors = {slug(line.lstrip("#")) for line in path.read_text(encoding="utf-8").splitlines()
                       if line.startswith("#")}
            assert anchor in anchors, f"{link}: no such heading in {path.name}"


def test_the_pages_that_lead_to_the_reference_link_it():
    assert "](REFERENCE.md" in CHAPTER.read_text(encoding="utf-8")
    assert "](REFERENCE.zh.md" in CHAPTER_ZH.read_text(encoding="utf-8")
    assert "s08_context_compact/REFERENCE.md" in (ROOT / "README.md").read_text(encoding="utf-8")
