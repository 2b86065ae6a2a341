"""What every other folder uses: secrets kept out, split emoji, lines on the terminal,
files in the workspace.

What the rest of the program may use from this folder."""

from .places import (DOTENV_EXAMPLE, OWN_DOTENV, OWN_FOLDERS, OWN_SKILLS, PROGRAM, PROMPTS_DIR,
                     TASK_OUTPUTS_DIR, TOOL_RESULTS_DIR, TRANSCRIPT_DIR, history_file, key_file,
                     state_folder, undo_folder)
from .redaction import REDACTED, SECRET_NAME, redact, Redactor, secret_values
from .tools import definitions, Tool, ToolCall
from .surrogates import HALF_ESCAPE, shown_so_far, well_formed, well_formed_deep
from .terminal import (STYLES, counted, cut_to_width, display_width, format_tokens, one_line,
                       printable, say_on, Screen, Spinner, StreamedText, terminal_columns,
                       WarningsOnce, wrapped)
from .glob_search import glob_files
from .workspace_files import (FOLDER, INSTRUCTIONS_TAG, discover_skills, edit_file,
                              file_kind, holds_exactly, in_own_folder, inside_workspace,
                              workspace_path, open_log, open_regular, output_names, own_folder,
                              path_risk, program_places, project_instructions, read_lines,
                              resolved, ToolError, walk_tree, write_file)
