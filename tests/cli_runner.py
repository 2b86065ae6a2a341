"""Run code.py as a command, in a child process forked from one that has already
imported the SDK.

Importing `anthropic` takes about 1.5 s, most of a CLI test's time. A small helper
process (the zygote) imports it once; for each run it forks a fresh child that runs
code.py as `__main__`, with its own environment, working folder, standard input and
output, and exit code: what `python code.py` does, minus the interpreter start. Tests
that need a terminal or signals (`LiveCLI`, the pty tests) still start `python code.py`.

The zygote is single-threaded, so forking it is safe; each pytest worker has its own.
"""

import atexit
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

CODE = Path(__file__).resolve().parent.parent / "s08_context_compact" / "code.py"
_zygote = None
_unfinished = None  # the pid of a terminal child whose test ended without reading its exit code


# ---------------------------------------------------------------- in the zygote and its children

def _child(job: dict) -> None:
    """The files (or a terminal) as fds 0, 1 and 2, the environment and folder, then code.py
    as a script."""
    if job.get("tty"):
        os.setsid()  # a session of its own, whose controlling terminal is the one opened next
        terminal = os.open(job["tty"], os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(terminal, fd)
    else:
        for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY)):
            os.dup2(os.open(os.path.join(job["folder"], name), mode), fd)
    sys.stdin = open(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    if job["env"].get("PYTHONPYCACHEPREFIX"):  # read by Python as it starts: the same, for what code.py imports
        sys.pycache_prefix = job["env"]["PYTHONPYCACHEPREFIX"]
        sys.dont_write_bytecode = bool(job["env"].get("PYTHONDONTWRITEBYTECODE"))
    script = job.get("code", str(CODE))  # another copy of the program, as a clone would hold it
    sys.argv = [script, *job["args"]]
    sys.path.insert(0, str(Path(script).parent))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
    except BaseException:  # a crash must look like one: a traceback and exit code 1
        import traceback
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # as the interpreter does when python code.py ends (os._exit skips them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve() -> None:
    import anthropic  # noqa: F401  (what every child would otherwise import again)
    import dotenv  # noqa: F401
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


# ---------------------------------------------------------------- in the tests

def _start(job: dict) -> int:
    """Hand a job to the zygote; the pid of the child that runs it. The zygote runs one child
    at a time: one a failed test left running is ended first, and its exit code read."""
    global _zygote
    if _unfinished is not None:
        exit_code(_unfinished, timeout=0)
    if _zygote is None or _zygote.poll() is not None:
        _zygote = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _zygote.stdin.write(json.dumps(job) + "\n")
    _zygote.stdin.flush()
    return json.loads(_zygote.stdout.readline())["pid"]


def start_on_terminal(args: list, *, tty: str, env: dict, cwd) -> int:
    """`python code.py *args` on the terminal whose device is tty, as its controlling terminal
    (so Ctrl-C there interrupts it); the child's pid. exit_code() says how it ended."""
    global _unfinished
    _unfinished = _start({"args": list(args), "env": dict(env), "cwd": str(cwd), "tty": tty, "code": str(CODE)})
    return _unfinished


def exit_code(pid: int, timeout: float = 30) -> int:
    """How the child ended; after timeout seconds it is killed (and TimeoutExpired raised, unless
    timeout is 0: then a child still running is simply ended)."""
    global _unfinished
    _unfinished = None
    ready, _, _ = select.select([_zygote.stdout], [], [], timeout)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        code = json.loads(_zygote.stdout.readline())["code"]
        if timeout:
            raise subprocess.TimeoutExpired(str(CODE), timeout)
        return code
    return json.loads(_zygote.stdout.readline())["code"]


def start(args: list, *, input: str = "", env: dict, cwd, code=None) -> tuple:
    """Start `python code.py *args` with piped input, without waiting: (pid, folder). The
    pid can be sent signals; finish(pid, folder) waits for the end and collects the output."""
    global _unfinished
    folder = tempfile.mkdtemp(prefix="s08-run-")
    Path(folder, "stdin").write_text(input, encoding="utf-8")
    Path(folder, "stdout").touch()
    Path(folder, "stderr").touch()
    _unfinished = _start({"args": list(args), "env": dict(env), "cwd": str(cwd), "folder": folder,
                          "code": str(code or CODE)})
    return _unfinished, folder


def finish(pid: int, folder: str, args: list = (), timeout: float = 60) -> subprocess.CompletedProcess:
    """The exit code and the output of a run start() began (after timeout seconds it is killed)."""
    try:
        code = exit_code(pid, timeout)
        out = Path(folder, "stdout").read_text(encoding="utf-8", errors="replace")
        err = Path(folder, "stderr").read_text(encoding="utf-8", errors="replace")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return subprocess.CompletedProcess([sys.executable, str(CODE), *args], code, out, err)


def run(args: list, *, input: str = "", env: dict, cwd, timeout: float = 60, code=None) -> subprocess.CompletedProcess:
    """Like subprocess.run([python, code.py, *args], input=..., capture_output=True, text=True);
    code: another copy of code.py to run."""
    pid, folder = start(args, input=input, env=env, cwd=cwd, code=code)
    try:
        return finish(pid, folder, args, timeout)
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired([str(CODE), *args], timeout) from None


if __name__ == "__main__":
    _serve()
