"""The history as plain dicts in the API's wire format, and the checks of a tool call's input.

What the rest of the program may use from this folder."""

from .history import (NO_REPLY, OWN, PROGRAM_FIELDS, append_message, blocks_of, cut_long_texts,
                      fresh_id, is_request_block, is_tool_result_message, last_reply_text,
                      own_text, paths_read, replace_history, replace_result, result_text,
                      said_text, sendable, tool_names, user_words, what_was_done, with_text)
from .tool_input import (Disk, check_tool_input, input_problem, park_oversized_inputs, refused_result,
                         todo_problem)
