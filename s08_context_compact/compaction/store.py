"""Where the layers put what they remove before they remove it: full tool results in
.task_outputs/tool-results/, removed messages as transcripts in .transcripts/. Files are
opened with "x" (create, never replace, never through a link) under names that are new each
time, so nothing is ever overwritten, in folders own_folder checked are real: a cloned
repository may plant a link there.

Machinery the chapter does not need. A Store saves what it is handed and decides nothing:
what to remove is each layer's decision. It keeps a list of what it wrote, so that the line
said after a layer runs can name where its text went.
"""

import json
import re
import time
import uuid
from pathlib import Path

from ..basics import (PROMPTS_DIR, TOOL_RESULTS_DIR, TRANSCRIPT_DIR, holds_exactly, open_regular,
                      output_names, own_folder, redact, Redactor, well_formed)
from ..messages import snipped_back, whole_groups

READ_BACK_BYTES = 64 * 1024 * 1024  # a snip's transcript read back for a summary, at most

def save_tool_output(folder: Path, tool_use_id: str, text: str) -> Path:
    """Write one full tool result, byte for byte, and return its path."""
    data = text.encode("utf-8", "surrogatepass")
    for path in output_names(folder, tool_use_id):
        if holds_exactly(path, data):
            return path  # the same content saved before: point at it again
        try:
            with open(path, "xb") as f:
                f.write(data)
            return path
        except FileExistsError:
            continue
    raise OSError(f"could not find a free file name for {tool_use_id} in {folder}")



def save_transcript(folder: Path, messages: list, kind: str, footer: dict | None = None) -> Path:
    """Write messages as JSON lines, one message a line (then the footer, if any), under a
    name never used before, and return the path."""
    path = folder / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}.jsonl"
    with open(path, "x", encoding="utf-8") as f:
        for record in messages + ([footer] if footer else []):
            # a lone emoji half cannot be written
            f.write(well_formed(json.dumps(record, ensure_ascii=False)) + "\n")
    return path



class Store:
    """Where the layers put what they remove, in the workspace: full tool outputs, and
    removed messages as transcripts. The history is redacted where content enters it; this
    is the last net before the disk. It keeps a list of what it wrote (written), so that the
    line said after a layer runs can name where its text went, and the last transcript."""

    def __init__(self, workdir: Path, secrets=()):
        self.workdir, self.secrets, self.written = workdir, Redactor.of(secrets), []
        self.last_transcript: Path | None = None

    def save_output(self, tool_use_id: str, text: str) -> Path:
        return self.wrote(save_tool_output(own_folder(self.workdir, TOOL_RESULTS_DIR), tool_use_id,
                                           redact(text, self.secrets)))

    def save_prompt(self, text: str) -> Path:
        return self.wrote(save_tool_output(own_folder(self.workdir, PROMPTS_DIR),
                                           f"prompt-{uuid.uuid4().hex[:8]}",
                                           redact(text, self.secrets)))

    def save_messages(self, messages: list, kind: str, footer: dict | None = None) -> Path:
        self.last_transcript = self.wrote(save_transcript(own_folder(self.workdir, TRANSCRIPT_DIR),
                                                          self.secrets.redact_json(messages),
                                                          kind, self.secrets.redact_json(footer)))
        return self.last_transcript

    def read_back(self, path) -> list | None:
        """The messages of a snip's transcript this program saved, for a summary: only a name
        it writes, in its own folder, never through a link or from a pipe, whole groups only.
        None when it cannot be read back (gone, changed, or not its own)."""
        name = str(path).rsplit("/", 1)[-1]
        if not re.fullmatch(r"snip-\d{8}-\d{6}-[0-9a-f]{8}\.jsonl", name):
            return None
        try:
            with open(open_regular(own_folder(self.workdir, TRANSCRIPT_DIR) / name), "rb") as f:
                data = f.read(READ_BACK_BYTES + 1)
            if len(data) > READ_BACK_BYTES:
                return None
            records = [json.loads(line) for line in data.decode("utf-8", "replace").splitlines()
                       if line.strip()]
        except (OSError, ValueError):
            return None
        part = [r for r in records if isinstance(r, dict) and "role" in r]
        # the last net before the request: it may have been changed since it was saved
        return self.secrets.redact_json(part) if whole_groups(part) else None

    def with_snipped(self, messages: list) -> list:
        """The history, and what its snips cut, read back (messages/history.py's snipped_back)."""
        return snipped_back(messages, self.read_back)

    def where_saved(self, messages: list, kind: str) -> str:
        """Save a transcript; say where it went, or why it could not be saved."""
        try:
            return f"saved at {self.save_messages(messages, kind)}"
        except OSError as err:
            return f"not saved ({err})"

    def wrote(self, path: Path) -> Path:
        self.written.append(path.relative_to(self.workdir))
        return self.written[-1]
