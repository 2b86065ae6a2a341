"""Every folder and file the program owns, named once: the folders it writes in the workspace,
the files beside its code, and what it keeps for you outside any workspace.

Machinery the chapter does not need: every other module reads its paths here, so that a
path changed here is changed everywhere.
"""

import os
from pathlib import Path

# In the workspace: the program's own folders. The model's tools never write there, and the
# sandbox lets a command read them only.
# session logs, what the layers removed, session pictures
TRANSCRIPT_DIR = ".transcripts"
TASK_OUTPUTS_DIR = ".task_outputs"
TOOL_RESULTS_DIR = ".task_outputs/tool-results"  # tool results too big to keep whole in context
PROMPTS_DIR = ".task_outputs/prompts"            # prompts too long to send whole
OWN_FOLDERS = (TRANSCRIPT_DIR, TASK_OUTPUTS_DIR)

# Beside the program's code, which the next start runs: a command must not change them.
PROGRAM = Path(__file__).resolve().parents[1]    # the package: code.py and the folders beside it
OWN_DOTENV = PROGRAM.parent / ".env"             # the program's own settings and key
DOTENV_EXAMPLE = PROGRAM.parent / ".env.example"
OWN_SKILLS = PROGRAM / "skills"                  # the example skills, found from any workspace


def state_folder() -> Path:
    """What the program keeps for you outside any workspace: $XDG_STATE_HOME/s08, else
    ~/.local/state/s08. Read when asked, so a test (or you) can move it."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "s08"


def key_file() -> Path:
    """The key that signs the session log's lines (session/log_checks.py)."""
    return state_folder() / "log-key"


def undo_folder() -> Path:
    """The copies /undo puts back (safety/undo.py), one folder a run."""
    return state_folder() / "undo"


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
