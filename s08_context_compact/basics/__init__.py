"""What every other folder uses: secrets kept out, split emoji, lines on the terminal, files in the workspace.

What the rest of the program may use from this folder."""

from .redaction import REDACTED, SECRET_NAME, redact, Redactor, secret_values
from .surrogates import HALF_ESCAPE, shown_so_far, well_formed, well_formed_deep
from .terminal import (HELP, STYLES, banner, counted, cut_to_width, display_width, format_tokens,
                       history_file, one_line, printable, say, Spinner, start_repl, StreamedText,
                       terminal_columns, terminal_confirm, WarningsOnce)
from .workspace_io import (INSTRUCTIONS_TAG, OWN_DOTENV, OWN_FOLDERS, discover_skills, edit_file,
                           file_kind, glob_files, holds_exactly, in_own_folder, inside_workspace,
                           open_log, open_regular, output_names, own_folder, path_risk,
                           program_places, project_instructions, read_lines, resolved, ToolError,
                           write_file)
