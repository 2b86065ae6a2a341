"""The REPL as people meet it: start-up, pastes, the terminal's width, history."""

import subprocess
import sys

from conftest import CODE


def imported_modules(workspace, *args, python_flags=()) -> tuple:
    """(the program's run, the top-level modules it imported)."""
    done = subprocess.run([sys.executable, *python_flags, "-X", "importtime", str(CODE), *args], capture_output=True,
                          text=True, cwd=workspace, env={"PATH": "/usr/bin:/bin", "HOME": str(workspace)}, timeout=60)
    modules = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return done, modules


def test_help_and_list_answer_without_importing_the_sdk(workspace):
    for args in (["--help"], ["--list"]):
        done, modules = imported_modules(workspace, *args)
        assert done.returncode == 0 and ("usage:" in done.stdout or "No sessions" in done.stdout), done.stderr
        assert "json" in modules, "the import log is read"
        assert "anthropic" not in modules and "httpx2" not in modules, args


def test_a_python_without_the_requirements_is_told_how_to_install_them(workspace):
    # -S leaves out site-packages: a Python that never had the requirements installed
    done = subprocess.run([sys.executable, "-S", str(CODE)], capture_output=True, text=True, cwd=workspace,
                          env={"PATH": "/usr/bin:/bin", "MODEL_ID": "m", "ANTHROPIC_API_KEY": "k"}, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "does not have anthropic and python-dotenv" in done.stderr
    assert "-m venv .venv" in done.stderr, "with the step that makes a virtual environment"
    assert f"pip install -r {CODE.parent.parent / 'requirements.txt'}" in done.stderr
