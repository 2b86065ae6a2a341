"""The history as plain dicts in the API's wire format, and the checks of a tool call's input.

What the rest of the program may use from this folder."""

from .history import (COMPACT_MARKER, NO_REPLY, NOTE_MARKER, OWN, PERSISTED_TAG,
                      PLACEHOLDER_PREFIX, PROGRAM_FIELDS, REACTIVE_MARKER, RESTORED_MARKER,
                      SNIP_MARKER, current_request, group_starts, message_groups, append_message,
                      blocks_of, covered_by, cut_long_texts, fresh_id, is_request_block,
                      is_tool_result_message, last_reply_text, own_text, paths_read,
                      replace_history, replace_result, result_text, said_text, sendable,
                      snip_bounds, tool_names, user_words, what_was_done, snipped_back,
                      snips_covered, snips_pending, tool_results, waiting_parts,
                      whole_groups, with_blocks, with_calls_grouped, with_snip_note, with_text,
                      written_text)
from .tool_input import (Disk, check_tool_input, input_problem, park_oversized_inputs,
                         refused_result, todo_problem)
from .token_counts import (CHARS_PER_TOKEN, estimate_text_tokens, estimate_tokens, head_within,
                           newest_groups, newest_within, TokenCounter)
