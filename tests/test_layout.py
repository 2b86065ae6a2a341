"""The house: the lesson (code.py) at the top of its folder, the machinery in folders by role
beside it. Each folder has a README with a line for each of its files and an __init__.py that
names what the rest may use; imports between folders flow one way, go through those faces, and
never reach code.py; one module names every place the program owns; and the lesson's folder is
never on sys.path, where code.py would stand in for the standard library's `code`."""

import ast
import importlib.util
import json
import re
import subprocess
import sys

from conftest import CODE

PACKAGE = CODE.parent
FOLDERS = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
NESTED = sorted(p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.glob("*/*/__init__.py"))
OWNED = (".transcripts", ".task_outputs", ".task_outputs/tool-results", "log-key", ".s08_history", ".env.example")


def modules(folder: str) -> list:
    return sorted(p for p in (PACKAGE / folder).glob("*.py"))


def imported(path) -> list:
    """(folder, module or None, names) for each import of the package's own code in a file."""
    found = []
    own_folder = path.parent.name if path.parent != PACKAGE else None
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [("code", None, ()) for a in node.names if a.name.split(".")[-1] == "code"]
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if node.level == 0 and parts[0] != "s08_context_compact":
                continue
            if node.level == 0 or node.level == 2:
                parts = parts[1:] if node.level == 0 else parts
            elif node.level == 1:
                parts = [own_folder] + parts
            parts = [p for p in parts if p]
            names = tuple(a.name for a in node.names)
            if not parts:  # from .. import x: a folder, or code.py itself
                found += [(name, None, ()) for name in names]
            else:
                found.append((parts[0], parts[1] if len(parts) > 1 else None, names))
    return found


def folder_imports() -> dict:
    return {folder: {f for path in modules(folder) for f, _, _ in imported(path) if f != folder}
            for folder in FOLDERS}


def test_the_top_holds_the_lesson_its_pages_and_folders_by_role():
    top = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    assert top == sorted(["code.py", "__init__.py", "README.md", "README.zh.md", "REFERENCE.md", "REFERENCE.zh.md",
                          "images", "skills", *FOLDERS])
    assert {"safety", "session", "endpoint", "offline"} <= set(FOLDERS)


def test_each_folder_has_a_readme_with_a_line_for_each_file_and_the_folders_it_imports():
    imports = {**folder_imports(), **{folder: set() for folder in NESTED}}
    for folder in FOLDERS + NESTED:
        readme = (PACKAGE / folder / "README.md").read_text(encoding="utf-8")
        listed = re.findall(r"^\| `([^`]+(?:\.py|/))` \| .+ \|$", readme, re.M)
        files = [p.name for p in modules(folder) if p.name != "__init__.py"]
        files += [p.name + "/" for p in (PACKAGE / folder).iterdir() if (p / "__init__.py").exists()]
        assert sorted(listed) == sorted(files), f"{folder}/README.md lists {listed}, the folder holds {files}"
        said = re.search(r"^Imports: (.*)\.$", readme, re.M)
        assert said, f"{folder}/README.md says which folders it imports"
        named = set(re.findall(r"\w+", said.group(1))) - {"none"}
        assert named == imports[folder], f"{folder}/README.md says it imports {named}, it imports {imports[folder]}"


# The house's floors, bottom first, declared once: a folder imports only from those below it.
ORDER = ("basics", "messages", "endpoint", "compaction", "safety", "session", "command_line", "offline")


def test_each_folder_imports_only_from_the_folders_declared_below_it():
    assert sorted(ORDER) == sorted(FOLDERS), "a new folder takes its place in ORDER"
    for folder, imported_folders in folder_imports().items():
        above = [f for f in imported_folders if ORDER.index(f) >= ORDER.index(folder)]
        assert not above, f"{folder}/ imports {above}, which ORDER puts above it"


def test_imports_flow_one_way_between_folders_through_their_faces_and_never_reach_code_py():
    imports = folder_imports()

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in imports.get(start, ()))
    assert not [f for f in FOLDERS if reaches(f, f)], f"the folders import each other in a circle: {imports}"
    for folder in FOLDERS:
        for path in modules(folder):
            for target, module, names in imported(path):
                assert target != "code", f"{path.relative_to(PACKAGE)} imports code.py"
                if target != folder and path.name != "__init__.py":
                    assert module is None, (f"{path.relative_to(PACKAGE)} reaches into {target}/{module}.py; "
                                            f"import {names} from {target}/__init__.py")
    lesson = [(target, module) for target, module, _ in imported(CODE)]
    assert not [t for t, m in lesson if m], "code.py imports each folder through its face"


def test_no_folder_takes_the_name_of_a_standard_or_installed_module():
    taken = [f for f in FOLDERS if f in sys.stdlib_module_names or importlib.util.find_spec(f) is not None]
    assert not taken and "code" in sys.stdlib_module_names


def test_one_module_names_every_place_the_program_owns():
    """A path the program owns appears as a value in basics/places.py only (a message may name
    it in prose); everything else imports it from there."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "places.py" or "offline" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value.rstrip("/")
                assert value not in OWNED and not value.startswith(tuple(o + "/" for o in OWNED)), \
                    f"{path.relative_to(PACKAGE)}:{node.lineno} names {node.value!r}: import it from basics/places.py"


BELOW_THE_COMMAND_LINE = ("basics", "messages", "endpoint", "compaction", "safety", "session")


def test_below_the_command_line_no_function_takes_the_whole_agent():
    """A function in the folders below command_line/ takes the values it uses (a say callable,
    the log, the settings, the store, a Screen, a Connection...), never a parameter named agent."""
    found = set()
    for folder in BELOW_THE_COMMAND_LINE:
        for path in (PACKAGE / folder).rglob("*.py"):
            def visit(node, inside: str) -> None:
                for child in ast.iter_child_nodes(node):
                    name = f"{inside}.{child.name}" if inside and hasattr(child, "name") else getattr(child, "name", "")
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                        args = child.args
                        if "agent" in [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs] + \
                                [a.arg for a in (args.vararg, args.kwarg) if a]:
                            found.add(f"{path.relative_to(PACKAGE).as_posix()}:{name or 'lambda'}")
                    visit(child, name if isinstance(child, (ast.ClassDef, ast.FunctionDef,
                                                            ast.AsyncFunctionDef)) else inside)
            visit(ast.parse(path.read_text(encoding="utf-8")), "")
    assert not found, f"these take the agent: {sorted(found)}"


def fields_of_classes(paths) -> set:
    """The fields and methods the classes in these files define (dataclass fields, self.x = ...)."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for part in ast.walk(node):
                    if isinstance(part, ast.AnnAssign) and isinstance(part.target, ast.Name):
                        found.add(part.target.id)
                    elif isinstance(part, ast.FunctionDef):
                        found.add(part.name)
                    elif isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store) and \
                            isinstance(part.value, ast.Name) and part.value.id == "self":
                        found.add(part.attr)
    return found


def test_below_the_command_line_nothing_touches_what_only_the_agent_has():
    """A copy of the agent kept and read under another name is still the agent: below
    command_line/, no attribute is read or set that only the Agent and its LoopState have
    (the usage totals, the summary failures, the loop state...). Names a value shares
    (settings, a client, a say) are left to the test above, which watches what each call is
    handed."""
    home = PACKAGE / "command_line" / "agent.py"
    agent_only = fields_of_classes([home]) - fields_of_classes(
        path for path in PACKAGE.rglob("*.py") if path != home)
    assert {"usage_totals", "disk_warned", "state", "stats"} <= agent_only
    found = []
    for folder in BELOW_THE_COMMAND_LINE:
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in agent_only:
                    found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} {ast.unparse(node)}")
    assert not found, f"these reach into the agent: {found}"


# Run inside the program: every call into a module below command_line/, on every thread, has
# its arguments looked at as it starts.
WATCH_THE_CALLS = """
import json, os, sys, threading
root = sys.argv[1]
sys.path.insert(0, root)
from s08_context_compact import code
from s08_context_compact.command_line import Agent, LoopState
package = os.path.join(root, "s08_context_compact")
below = tuple(os.path.join(package, folder) + os.sep for folder in sys.argv[2].split(","))
found = set()

import dataclasses, functools

# Whether the agent, a copy of it or its loop state is reachable from a value: through a
# partial's function and arguments, a closure's cells, a bound method's object, a dataclass's
# fields, or the items of a tuple, list or dict.
ATOMS = (str, bytes, int, float, bool, type(None))

def reaches_the_agent(value, depth=0, seen=None):
    seen = set() if seen is None else seen
    if isinstance(value, ATOMS) or id(value) in seen or depth > 6:
        return False
    seen.add(id(value))
    if isinstance(value, (Agent, LoopState)):
        return True
    if isinstance(value, functools.partial):
        parts = [value.func, *value.args, *value.keywords.values()]
    elif hasattr(value, "__self__") and not isinstance(value.__self__, type(sys)):
        parts = [value.__self__, getattr(value, "__func__", None)]
    elif hasattr(value, "__closure__") and hasattr(value, "__code__"):
        parts = [cell.cell_contents for cell in value.__closure__ or () if cell_filled(cell)]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    elif isinstance(value, (tuple, list)) and depth < 2:  # a history's messages hold only JSON
        parts = list(value)[:64]
    elif isinstance(value, dict) and depth < 2:
        parts = list(value.values())[:64]
    else:
        return False
    return any(reaches_the_agent(part, depth + 1, seen) for part in parts)

def cell_filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False

def watch(frame, event, arg):
    if event != "call" or not frame.f_code.co_filename.startswith(below):
        return
    for name, value in frame.f_locals.items():
        if reaches_the_agent(value):
            where = os.path.relpath(frame.f_code.co_filename, package)
            found.add(f"{where}:{frame.f_code.co_name}({name})")

threading.settrace(watch)
sys.settrace(watch)
status = code.main(["--demo", "--no-pause"])
sys.settrace(None)
threading.settrace(None)
print(json.dumps({"status": status, "found": sorted(found)}), file=sys.stderr)
"""


def test_below_the_command_line_no_call_is_handed_the_agent(tmp_path):
    """Whatever a parameter is called: the demo plays every layer, a summary written ahead
    and its worker, the compact tool and the breaker, and no function below command_line/ is
    handed the Agent, a copy of it, or its LoopState."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", WATCH_THE_CALLS, str(PACKAGE.parent),
                           ",".join(BELOW_THE_COMMAND_LINE)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["status"] == 0 and "[compact_history]" in done.stdout and "[summary ahead]" in done.stdout
    assert report["found"] == [], f"handed the agent: {report['found']}"


def test_run_as_a_script_the_lesson_is_not_the_standard_librarys_code():
    """What `python s08_context_compact/code.py` does, then what a learner's breakpoint() or
    pdb does next: import the standard library's `code`."""
    script = (f"import runpy, sys\n"
              f"sys.path.insert(0, {str(PACKAGE)!r})\n"  # as Python does for a script
              f"sys.argv = [{str(CODE)!r}, '--help']\n"
              "try:\n"
              f"    runpy.run_path({str(CODE)!r}, run_name='__main__')\n"
              "except SystemExit:\n"
              "    pass\n"
              f"assert {str(PACKAGE)!r} not in sys.path, sys.path\n"
              "import code, pdb\n"
              "print(code.InteractiveConsole.__name__, code.__file__)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("InteractiveConsole ") and str(PACKAGE) not in last


def test_tests_reach_the_machinery_in_its_folder_not_through_code_py():
    """code.py is the lesson: a test that reads a machinery name through its namespace (a store
    taken as s08's) would break when the lesson stops importing it, and hides where it lives."""
    tree = ast.parse(CODE.read_text(encoding="utf-8"))
    borrowed = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("s08_context_compact") for alias in node.names}
    found = []
    for path in sorted(CODE.parent.parent.glob("tests/*.py")):
        for match in re.finditer(r"\b(?:s08|code)\.([A-Za-z_]\w*)\b", path.read_text(encoding="utf-8")):
            if match.group(1) in borrowed:
                found.append(f"{path.name}: {match.group(0)}")
    assert not found, found
