"""What the layers lean on: every size from the window, the store, previews, the summary's
writer and its pieces, the summary written ahead, repeated reads, the fact ledger.

What the rest of the program may use from this folder."""

from .ledger import ForTheLedger, Ledger, ledger_hooks, short_hash
from .previews import fewer_tokens, persisted_preview, pointed_to, preview_results, previewed
from .repeat_reads import RepeatReads, true_stubs
from .snip_summaries import SnipSummaries
from .summary_ahead import SummaryAhead
from .summary_writer import MAX_CONSECUTIVE_SUMMARY_FAILURES, SUMMARY_ATTEMPTS, SummaryWriter
from .settings import Settings
from .store import Store
from .summary import (nothing_to_summarize, render_todos, Restorable, replace_with_summary,
                      summary_marks, what_comes_back)
