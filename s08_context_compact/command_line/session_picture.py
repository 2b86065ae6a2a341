"""A picture of a session, drawn from its log: the context at every model call against
the window, the threshold, the micro trigger and the early mark; each layer's run where
it happened, with what it freed; the user's prompts along the way; what each call was
billed as; and what each compaction removed and where it went. One self-contained HTML
page (no script, no font, no network), and the chart alone as SVG for the chapter.

Machinery the chapter does not need. write_report() writes the page beside the log, and
report_line() says where it is; reading and trusting the log is session/'s job. Everything
shown comes from the session log, which is already redacted, and from the transcripts it
names; every piece of text is escaped, so nothing a file or the model wrote can become
markup.
"""

import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..session import log_lines, records_of, trusted_lines
from .work_lines import LAYER_VERBS, billed_input
from ..basics import format_tokens, open_regular, printable

MAX_POINTS = 1_500          # calls drawn one by one; more are drawn in groups (the peak of each)
MAX_TICKS = 400             # prompt ticks; more prompts share a tick
MAX_ROWS = 400              # rows of the compactions table; the rest are counted
SUMMARY_CHARS = 3_000       # of each summary shown folded; the transcript has the rest...
# ...and of all of them together, so a long session's page stays small
SUMMARIES_CHARS = 300_000
TITLE_CHARS = 160           # of a prompt shown when the pointer rests on its tick
WIDTH, HEIGHT, LEFT, TOP, BOTTOM = 920, 340, 64, 16, 44
COLOURS = {"tool_result_budget": "#2a9d8f", "snip_compact": "#e9c46a", "micro_compact": "#f4a261",
           "compact_history": "#e76f51", "reactive_compact": "#9b2226"}
# the mark: where a summary starts in the background (summary_ahead.py)
LIMITS = {"window": ("#6c757d", "6 3"), "threshold": ("#d62828", "4 3"),
          "micro_trigger": ("#f4a261", "2 3"), "mark": ("#457b9d", "1 3")}
LIMIT_NAMES = {"window": "window", "threshold": "threshold (auto-compact)",
               "micro_trigger": "micro trigger", "mark": "early mark (summary ahead)"}
COST = {"cache_read_input_tokens": ("cache reads", "#a8dadc"),
        "cache_creation_input_tokens": ("cache writes", "#457b9d"),
        "input_tokens": ("uncached input", "#1d3557")}
SUMMARY_LAYERS = ("compact_history", "reactive_compact")


@dataclass
class Session:
    """What the log says happened, in order: model calls, layer runs, prompts."""
    header: dict = field(default_factory=dict)
    calls: list = field(default_factory=list)      # call records of the main agent's steps
    # (index of the next step, call record) of summary calls
    summaries: list = field(default_factory=list)
    layers: list = field(default_factory=list)     # (index of the next step, layer record)
    prompts: list = field(default_factory=list)    # (index of the next step, text)
    clears: list = field(default_factory=list)     # index of the next step after each /clear
    untrusted: str = ""                            # why some lines were left out


def read_session_log(path: Path) -> Session:
    """The session a log holds: only the lines the program wrote and signed."""
    lines, _, problem = trusted_lines(log_lines(path))
    session = Session(untrusted=problem)
    for record in filter(None, records_of(lines)):
        kind, at = record.get("type"), len(session.calls)
        if kind == "session":
            session.header = record
        elif kind == "call" and isinstance(record.get("context_tokens"), int):
            if record.get("what", "waiting for the model") == "waiting for the model":
                session.calls.append(record)
            else:
                session.summaries.append((at, record))
        elif kind == "layer" and record.get("layer") in COLOURS:
            session.layers.append((at, record))
        elif kind in ("message", "replace_last") and isinstance(record.get("prompt"), str):
            session.prompts.append((at, record["prompt"]))
        elif kind == "rewrite" and record.get("reason") == "/clear":
            session.clears.append(at)
    return session


def escaped(value) -> str:
    """Text as it may stand in HTML and in XML (SVG): escaped, control characters shown,
    not kept."""
    return html.escape(printable(str(value)), quote=True)


# ---- the chart -----------------------------------------------------------------------------------

def grouped(session: Session) -> tuple:
    """(points, step): the calls as drawn, one a point or, past MAX_POINTS, the peak of each
    group."""
    step = max(1, -(-len(session.calls) // MAX_POINTS))
    points = []
    for start in range(0, len(session.calls), step):
        group = session.calls[start:start + step]
        peak = max(group, key=lambda r: r["context_tokens"])
        usage = {key: sum((r.get("usage") or {}).get(key, 0) for r in group) for key in COST}
        points.append({**group[-1], "context_tokens": peak["context_tokens"], "usage": usage,
                       "first": start, "count": len(group)})
    return points, step


def chart_svg(session: Session) -> str:
    """The context at every model call, the limits, the layers' runs and the prompts, as SVG."""
    points, step = grouped(session)
    if not points:
        return svg_frame(WIDTH, 80, ['<text x="20" y="44" class="note">'
                                     'No model call in this session yet.</text>'])
    top = max(max(p.get("window") or p["context_tokens"] for p in points),
              max(p["context_tokens"] for p in points))
    plot_w, plot_h = WIDTH - LEFT - 16, HEIGHT - TOP - BOTTOM

    def x(index: float) -> float:
        return round(LEFT + plot_w * (index + 0.5) / len(points), 1)

    def y(tokens: float) -> float:
        return round(TOP + plot_h * (1 - tokens / top), 1)
    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="plot"/>']
    for share in (0.25, 0.5, 0.75, 1.0):  # the axis, in tokens
        parts.append(f'<text x="{LEFT - 6}" y="{y(top * share) + 4}" class="axis" '
                     'text-anchor="end">'
                     f'{format_tokens(int(top * share))}</text>')
    for name, (colour, dash) in LIMITS.items():
        steps = [(x(i - 0.5), x(i + 0.5), p.get(name)) for i, p in enumerate(points)]
        path = " ".join(f"M{a},{y(v)} H{b}" for a, b, v in steps if isinstance(v, int) and v > 0)
        if path:
            parts.append(f'<path d="{path}" stroke="{colour}" stroke-dasharray="{dash}" '
                         'class="limit">'
                         f'<title>{escaped(LIMIT_NAMES[name])}</title></path>')
    line = " ".join(f"{x(i)},{y(p['context_tokens'])}" for i, p in enumerate(points))
    parts.append(f'<polyline points="{line}" class="context"/>')
    for i, p in enumerate(points):
        calls = (f"calls {p['first'] + 1}–{p['first'] + p['count']}" if p["count"] > 1
                 else f"call {p['first'] + 1}")
        parts.append(f'<circle cx="{x(i)}" cy="{y(p["context_tokens"])}" '
                     f'r="{2.5 if step == 1 else 1.2}" '
                     f'class="point"><title>{calls}: {p["context_tokens"]:,} tokens '
                     f'({"counted by the endpoint" if p.get("exact") else "estimated"})'
                     '</title></circle>')
    for at, group in grouped_events(session.summaries, step, len(points)):
        peak = max(r["context_tokens"] for r in group)
        what = f"{len(group)} summary calls, the largest" if len(group) > 1 else "a summary call:"
        # a summary written ahead that never reached the history is logged with why
        # (summary_ahead.py)
        aside = "".join(f"; {escaped(r['what'])}" for r in group
                        if str(r.get("what", "")).endswith(")"))
        parts.append(f'<rect x="{x(at - 0.5) - 3}" y="{y(peak) - 3}" width="6" height="6" '
                     f'class="summary"><title>{what} {peak:,} tokens in{aside}</title></rect>')
    parts += layer_marks(session, step, len(points), x, y(top), y(0))
    wider = -(-len(points) // MAX_TICKS)
    for at, group in grouped_events(session.prompts, step, len(points), wider):
        more = f" (and {len(group) - 1} more)" if len(group) > 1 else ""
        parts.append(f'<path d="M{x(at - 0.5)},{y(0)} v8" class="prompt"><title>prompt{more}: '
                     f'{escaped(" ".join(group[0].split())[:TITLE_CHARS])}</title></path>')
    label = "model calls" + (f" (each point the peak of {step})" if step > 1 else "")
    parts.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" class="axis" '
                 'text-anchor="middle">'
                 f'{label}; ticks below: your prompts</text>')
    return svg_frame(WIDTH, HEIGHT + 40, parts + legend(HEIGHT + 4))


def bucketed(events: list, step: int, count: int) -> list:
    """Events placed at the group of calls they came before
    (the last ones after the last call)."""
    return [(min(at // step, count), item) for at, item in events]


def grouped_events(events: list, step: int, count: int, wider: int = 1) -> list:
    """[(place, [items])]: the events of one group of calls (or of `wider` groups) together,
    one mark for all of them."""
    places = {}
    for at, item in bucketed(events, step, count):
        places.setdefault(at // wider * wider, []).append(item)
    return sorted(places.items(), key=lambda pair: pair[0])


def layer_marks(session: Session, step: int, count: int, x, top: float, bottom: float) -> list:
    """A line where each layer ran (the runs of one group together), coloured by layer."""
    runs = {}
    for at, record in bucketed(session.layers, step, count):
        key = (at, record["layer"])
        n, saved = runs.get(key, (0, 0))
        runs[key] = (n + 1, saved + max(int(record.get("tokens_saved") or 0), 0))
    marks = []
    for (at, name), (n, saved) in sorted(runs.items()):
        times = f" ×{n}" if n > 1 else ""
        marks.append(f'<line x1="{x(at - 0.5)}" y1="{top}" x2="{x(at - 0.5)}" y2="{bottom}" '
                     f'stroke="{COLOURS[name]}" '
                     f'class="layer"><title>{name}{times}: freed {saved:,} tokens '
                     f'({escaped(LAYER_VERBS[name])})</title></line>')
    return marks


def legend(y: int) -> list:
    parts, left = [], LEFT
    for name, colour in COLOURS.items():
        parts.append(f'<rect x="{left}" y="{y}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{left + 15}" y="{y + 9}" class="axis">{name}</text>')
        left += 24 + 6.2 * len(name)
    left, y = LEFT, y + 16  # the limits on a line of their own
    for name, (colour, dash) in LIMITS.items():
        parts.append(f'<path d="M{left},{y + 5} h12" stroke="{colour}" '
                     f'stroke-dasharray="{dash}" class="limit"/>'
                     f'<text x="{left + 15}" y="{y + 9}" class="axis">{LIMIT_NAMES[name]}</text>')
        left += 24 + 6.2 * len(LIMIT_NAMES[name])
    return parts


def cost_svg(session: Session) -> str:
    """What each call was billed for: cache reads, cache writes and uncached input, stacked."""
    points, step = grouped(session)
    if not points:
        return ""
    height, plot_w = 160, WIDTH - LEFT - 16
    top = max(sum(p["usage"].get(k, 0) for k in COST) for p in points) or 1
    width = plot_w / len(points)
    parts = [f'<text x="{LEFT - 6}" y="{TOP + 4}" class="axis" text-anchor="end">'
             f'{format_tokens(top)}</text>']
    for i, p in enumerate(points):
        base = 0
        said = ", ".join(f"{name} {p['usage'].get(key, 0):,}" for key, (name, _) in COST.items())
        parts.append(f"<g><title>{said}</title>")  # one title for the bar's three parts
        for key, (name, colour) in COST.items():
            value = p["usage"].get(key, 0)
            if value:
                h = (height - TOP - 20) * value / top
                base += h
                parts.append(f'<rect x="{round(LEFT + i * width, 1)}" '
                             f'y="{round(height - 20 - base, 1)}" '
                             f'width="{max(round(width - 0.3, 1), 0.3)}" height="{round(h, 1)}" '
                             f'fill="{colour}"/>')
        parts.append("</g>")
    parts.append(f'<text x="{LEFT + plot_w / 2}" y="{height - 4}" class="axis" '
                 'text-anchor="middle">input tokens '
                 f'of each model call{f" (each bar {step} calls)" if step > 1 else ""}: '
                 + ", ".join(f'<tspan fill="{c}">■</tspan> {n}' for n, c in COST.values())
                 + '</text>')
    return svg_frame(WIDTH, height, parts)


def svg_frame(width: int, height: int, parts: list) -> str:
    style = ("<style>.plot{fill:#fafafa;stroke:#ccc}.axis{font:11px sans-serif;fill:#444}"
             ".note{font:13px sans-serif;fill:#444}.limit{fill:none;stroke-width:1.5}"
             ".context{fill:none;stroke:#1d3557;stroke-width:1.8}.point{fill:#1d3557}"
             ".summary{fill:#fff;stroke:#e76f51;stroke-width:1.5}.layer{stroke-width:2;opacity:.8}"
             ".prompt{stroke:#2b2d42;stroke-width:1.5}</style>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" '
            f'height="{height}" role="img">{style}' + "".join(parts) + "</svg>\n")


# ---- the page ------------------------------------------------------------------------------------

def link(path: str, page: Path) -> str:
    """A relative link to a file the log names, if it is there; its name otherwise."""
    target = Path(path)
    if not target.is_absolute():
        target = page.parent.parent / target  # the log's paths are relative to the workspace
    relative = os.path.relpath(target, page.parent)
    if not target.exists():
        return f"{escaped(relative)} (not on disk)"
    return f'<a href="{escaped(Path(relative).as_posix())}">{escaped(relative)}</a>'


def compaction_footer(path: str) -> dict:
    """The footer a summary's transcript ends with: the summary, who wrote it, the ledger's
    check."""
    # a regular file only: a pipe put in its place would make the report wait forever
    try:
        with os.fdopen(open_regular(Path(path)), "rb") as file:
            file.seek(max(os.fstat(file.fileno()).st_size - 400_000, 0))
            last = file.read().decode("utf-8", "replace").rstrip("\n").rsplit("\n", 1)[-1]
        footer = json.loads(last)
    except (OSError, ValueError):
        return {}
    return footer if isinstance(footer, dict) and footer.get("type") == "compaction" else {}


SNIP_SUMMARY_CALL = "summarizing what snip cut: "  # snip_summaries.py's bills: what came of it
SNIP_SUMMARY_JOINED = SNIP_SUMMARY_CALL + "joined, for "


def snip_fates(session: Session, summary_by: dict | None = None) -> dict:
    """For each snip run (its place in session.layers): when what it cut was summarized, in
    the background (the call whose bill names its transcript: from then on it is in view) or
    with the whole history (a summary layer after it, unless `summary_by`, who wrote each
    summary layer's summary, says it was built without the model), that /clear dropped it
    first, or that it still waits where the log ends (its summary failed, or is still being
    written)."""
    joined = [(at, str(r.get("what", ""))) for at, r in session.summaries
              if str(r.get("what", "")).startswith(SNIP_SUMMARY_JOINED)]
    failed = [str(r.get("what", "")) for _, r in session.summaries
              if str(r.get("what", "")).startswith(SNIP_SUMMARY_CALL + "failed")]
    fates = {}
    for k, (at, record) in enumerate(session.layers):
        if record["layer"] != "snip_compact":
            continue
        names = {Path(p).name for p in record.get("saved_to") or [] if isinstance(p, str)}
        when = next((then for then, what in joined if then >= at
                     and names & set(what[len(SNIP_SUMMARY_JOINED):].split())), None)
        j, summary = next(((j, then) for j, (then, r) in enumerate(session.layers[k + 1:], k + 1)
                           if r["layer"] in SUMMARY_LAYERS), (None, None))
        cleared = next((then for then in session.clears if then >= at), None)
        if cleared is not None and all(then is None or cleared <= then for then in (when, summary)):
            fates[k] = f"dropped by /clear before call {cleared + 1}; its transcript keeps it"
        elif when is not None and (summary is None or when <= summary):
            fates[k] = f"summarized in the background, in view from call {when + 1}"
        elif summary is not None and (summary_by or {}).get(j) == "fallback":
            fates[k] = (f"not summarized: the summary before call {summary + 1} was built "
                        "without the model; its transcript keeps it")
        elif summary is not None:
            fates[k] = f"summarized with the whole history before call {summary + 1}"
        elif any(names & set(what.rsplit(", for ", 1)[-1].split()) for what in failed):
            fates[k] = "its summary failed; waiting for the next summary of the history"
        else:
            fates[k] = "waiting to be summarized where the log ends"
    return fates


def summary_footers(session: Session, page: Path) -> dict:
    """Each summary layer's footer (its place in session.layers: the footer), from the
    transcript it saved."""
    footers = {}
    for k, (_, record) in enumerate(session.layers):
        places = [p for p in record.get("saved_to") or [] if isinstance(p, str)]
        transcript = next((p for p in places if p.endswith(".jsonl")), None)
        if record["layer"] in SUMMARY_LAYERS and transcript:
            footers[k] = compaction_footer(str(Path(transcript) if Path(transcript).is_absolute()
                                               else page.parent.parent / transcript))
    return footers


def compaction_rows(session: Session, page: Path) -> str:
    footers = summary_footers(session, page)
    rows = []
    fates = snip_fates(session, {k: footer.get("summary_by") for k, footer in footers.items()})
    summaries = sum(1 for _, r in session.layers[:MAX_ROWS] if r["layer"] in SUMMARY_LAYERS)
    shown = min(SUMMARY_CHARS, SUMMARIES_CHARS // max(summaries, 1))
    for k, (at, record) in enumerate(session.layers[:MAX_ROWS]):
        name, saved = record["layer"], int(record.get("tokens_saved") or 0)
        places = [p for p in record.get("saved_to") or [] if isinstance(p, str)]
        cells = [f"before call {at + 1}",
                 f'<span style="color:{COLOURS[name]}">■</span> {escaped(name)}',
                 f"{saved:,}", "<br>".join(link(p, page) for p in places)]
        details = escaped(fates.get(k, ""))  # what snip cut: summarized, or waiting
        if k in footers:
            footer = footers[k]
            ledger = footer.get("ledger") or {}
            check = (f"ledger: {ledger.get('retained')} of {ledger.get('total')} facts "
                     "in the summary" if ledger else "")
            summary = str(footer.get("summary", ""))
            cut = (f"\n[… {len(summary) - shown:,} more characters in the transcript]"
                   if len(summary) > shown else "")
            details = (f"summary by {escaped(footer.get('summary_by', '?'))}"
                       f"{'; ' + escaped(check) if check else ''}"
                       "<details><summary>the summary</summary>"
                       f"<pre>{escaped(summary[:shown] + cut)}</pre>"
                       "</details>") if footer else "transcript not readable"
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells + [details]) + "</tr>")
    more = len(session.layers) - MAX_ROWS
    tail = f'<p class="note">… and {more:,} more runs, not listed.</p>' if more > 0 else ""
    if not rows:
        return "<p>No layer ran in this session.</p>"
    return ("<table><tr><th>when</th><th>layer</th><th>tokens freed</th><th>saved to</th>"
            "<th>summary</th></tr>"
            + "".join(rows) + "</table>" + tail)


def totals_line(session: Session) -> str:
    calls = session.calls + [r for _, r in session.summaries]
    totals = {key: sum((r.get("usage") or {}).get(key, 0) for r in calls) for key in COST}
    sent = sum(totals.values())
    return (f"{len(session.calls):,} model calls and {len(session.summaries):,} summary calls; "
            f"{sent:,} input tokens sent "
            f"({totals['cache_read_input_tokens']:,} read from the cache, "
            f"{totals['cache_creation_input_tokens']:,} written to it, "
            f"{totals['input_tokens']:,} uncached), "
            f"billed as {billed_input(totals):,.0f} at the 5-minute cache's prices")


def page_html(session: Session, page: Path, log: Path) -> str:
    head = session.header
    title = f"Session {head.get('id', log.stem)}"
    warning = (f'<p class="warn">{escaped(session.untrusted)}; those lines are not shown.</p>'
               if session.untrusted else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escaped(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:14px/1.45 sans-serif;margin:24px;color:#222;max-width:960px}}\
svg{{max-width:100%;height:auto}}
table{{border-collapse:collapse;width:100%}}\
td,th{{border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;
vertical-align:top}}pre{{white-space:pre-wrap;background:#f6f6f6;padding:8px}}.note{{color:#555}}
.warn{{color:#9b2226}}</style></head><body>
<h1>{escaped(title)}</h1>
<p>Model {escaped(head.get("model", "?"))}, a {int(head.get("window") or 0):,}-token window. Log:
{link(str(log), page)}.</p>{warning}
<h2>The context at each model call</h2>
<p class="note">The line climbs as the conversation grows; \
each coloured line is a layer that ran just before
the next call, and the drop after it is what it freed. \
Rest the pointer on a point, a line or a tick for its
numbers. Squares are summary calls.</p>
{chart_svg(session)}
<h2>What each call was billed for</h2>
<p>{escaped(totals_line(session))}.</p>
{cost_svg(session)}
<h2>What each layer removed, and where it went</h2>
{compaction_rows(session, page)}
</body></html>
"""


def write_report(log: Path) -> Path:
    """Write the page for a session log beside it, in .transcripts/, and the chart alone as
    SVG (to put in a document); return the page's path."""
    page = log.with_name(f"report-{log.stem.removeprefix('session-')}.html")
    session = read_session_log(log)
    write_whole(page, page_html(session, page, log))
    write_whole(page.with_suffix(".svg"), chart_svg(session))
    return page


def write_whole(path: Path, content: str) -> None:
    """Written aside first, under a name no one else has ("x" refuses one planted there, a link
    included), then put in place whole."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "x", encoding="utf-8") as file:
        try:
            file.write(content)
        except BaseException:
            partial.unlink()
            raise
    os.replace(partial, path)


def report_line(log: Path | None) -> tuple:
    """What /report and --report say: (where the page is, its address to open in a browser,
    to be shown whole on a line of its own however narrow the terminal), or (why there is
    none, "")."""
    if log is None:
        return ("[report] nothing to picture yet: "
                "the session has no log until its first message.", "")
    try:
        page = write_report(log)
    except OSError as err:
        return f"[report] could not write the page ({err}).", ""
    return f"[report] a picture of the session: {page}\nTo open in a browser:", f"  {page.as_uri()}"
