"""The span tree of ``fakefleet trace show`` as a table that fits a given width.

The service, cluster, offset and duration columns are as wide as their widest value and are
never cut. The span column (tree guides, then the span's name) takes the width that is left,
and the timeline whatever remains after it (none when too little does): a name longer than
its column is shortened from the middle, keeping its start and its end. The lines under a
span (its error, its links, a parent missing from the store) wrap at the table's width.

Laying out only: nothing here reads the store or prints.
"""

from __future__ import annotations

import dataclasses
import textwrap

from rich.align import AlignMethod
from rich.text import Text

from federation.telemetry.reading import Node, StoredSpan

#: OTLP's status code of a failed span.
STATUS_ERROR = 2
#: Spaces between two columns (none before the first or after the last).
GAP = 2
#: The timeline's width when there is room, and the narrowest worth showing (its header's).
BAR_WIDTH = 24
BAR_MIN = len("timeline")
#: The span column is never made narrower than this to give the timeline room...
SPAN_MIN = 36
#: ...nor narrower than this at all, even if the table is then wider than the terminal.
SPAN_FLOOR = 16
#: The columns that are never cut, in their order after the span column.
FIXED = ("service", "cluster", "offset", "duration")
#: Lines under a span wrap no narrower than this, even in a table narrower than that.
NOTE_MIN = 24

Row = tuple[Node, int, str]


@dataclasses.dataclass(frozen=True)
class _Line:
    """A span's row before it is fitted: its guide and name, a marker that follows the name
    when there is room (else it goes under the span), the lines under the span, and the
    values of the columns that are never cut."""

    guide: str
    name: str
    marker: str
    notes: list[tuple[str, str]]
    cells: tuple[str, str, str, str]
    span: StoredSpan

    @property
    def wanted(self) -> int:
        """The span column's width that shows the span's name, and its marker, unshortened."""
        return len(self.guide) + len(self.name) + (len(self.marker) + 2 if self.marker else 0)


def render(rows: list[Row], *, start_ns: int, total_ns: int, width: int) -> Text:
    """The span tree as a table in ``width`` columns: tree guides and names, then service,
    cluster, offset, duration and a bar of where in the trace the span ran; the lines under a
    span as wide as the table."""
    names = {node.span.span_id: node.span.name for node, _, _ in rows}
    lines = [_line(node, guide, start_ns, names) for node, _, guide in rows]
    fixed = [max([len(header), *(len(line.cells[i]) for line in lines)])
             for i, header in enumerate(FIXED)]
    span_width, bar_width = fit(width, fixed=sum(fixed) + GAP * len(fixed),
                                wanted=max([len("span"), *(line.wanted for line in lines)]))
    columns: list[tuple[str, int, AlignMethod]] = [("span", span_width, "left")]
    for header, column_width in zip(FIXED, fixed, strict=True):
        columns.append((header, column_width,
                        "right" if header in ("offset", "duration") else "left"))
    if bar_width:
        columns.append(("timeline", bar_width, "left"))
    table_width = sum(column_width for _, column_width, _ in columns) + GAP * (len(columns) - 1)
    table = _joined([Text(header, style="bold") for header, _, _ in columns], columns)
    for line in lines:
        bar = [Text(_bar(line.span, start_ns, total_ns, bar_width))] if bar_width else []
        label, notes = _fitted(line, span_width, table_width)
        table.append("\n")
        table.append_text(_joined([label, *map(Text, line.cells), *bar], columns))
        for note in notes:
            table.append("\n")
            table.append_text(note)
    return table


def _joined(cells: list[Text], columns: list[tuple[str, int, AlignMethod]]) -> Text:
    """One line of the table: each cell aligned in its column, two columns ``GAP`` apart."""
    joined = Text()
    for i, (cell, (_, column_width, justify)) in enumerate(zip(cells, columns, strict=True)):
        aligned = cell.copy()
        aligned.align(justify, column_width)
        joined.append(" " * GAP if i else "")
        joined.append_text(aligned)
    joined.rstrip()
    return joined


def fit(width: int, *, fixed: int, wanted: int) -> tuple[int, int]:
    """The widths of the span column and of the timeline (0: no timeline) in ``width``
    columns, when the columns never cut take ``fixed`` of them (with their gaps) and the span
    column would show everything in ``wanted``."""
    room = width - fixed
    span = min(wanted, max(SPAN_MIN, room - GAP - BAR_WIDTH))
    bar = min(BAR_WIDTH, room - span - GAP)
    if bar < BAR_MIN:
        return min(wanted, max(SPAN_FLOOR, room)), 0
    return span, bar


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and its end around an ellipsis."""
    if len(text) <= width:
        return text
    if width < 2:
        return "…"[:width]
    tail = (width - 1) // 2
    return text[:width - 1 - tail] + "…" + (text[len(text) - tail:] if tail else "")


def _line(node: Node, guide: str, start_ns: int, names: dict[str, str]) -> _Line:
    """What a span's row shows, before it is fitted to a width (``names``: the trace's span
    names by id, for its links)."""
    span = node.span
    notes: list[tuple[str, str]] = []
    if span.status_code == STATUS_ERROR:
        notes.append((f"✗ error: {span.status_message}", "red"))
    for link in span.links:
        target = names.get(link["span_id"]) if link["trace_id"] == span.trace_id else None
        where = "this trace" if target else f"trace {link['trace_id']}"
        notes.append((f"↪ link to span {link['span_id']} of {where}"
                      f"{f' ({target})' if target else ''}", "dim"))
    return _Line(
        guide=guide, name=span.name or "(unnamed)",
        marker=f"⚠ parent {span.parent_span_id} missing" if node.orphan else "",
        notes=notes, span=span,
        cells=(span.service, span.cluster or "-", f"+{duration(span.start_ns - start_ns)}",
               duration(span.duration_ns)))


def _fitted(line: _Line, width: int, table_width: int) -> tuple[Text, list[Text]]:
    """The span's label in ``width`` columns, and the lines under it in ``table_width``."""
    name_style = "red" if line.span.status_code == STATUS_ERROR else ""
    label = Text(line.guide, style="dim")
    notes = line.notes
    if line.marker:
        on_line = len(line.guide) + len(line.name) + 2 + len(line.marker) <= width
        if on_line:
            label.append(line.name, style=name_style)
            label.append(f"  {line.marker}", style="yellow")
            return label, [_note(line.guide, text, style, table_width) for text, style in notes]
        notes = [(line.marker, "yellow"), *notes]
    label.append(shorten(line.name, width - len(line.guide)), style=name_style)
    return label, [_note(line.guide, text, style, table_width) for text, style in notes]


def _note(guide: str, text: str, style: str, width: int) -> Text:
    """A line under a span, wrapped to ``width`` below the span's guide; its later lines
    indented past the note's symbol."""
    prefix = _continuation(guide) + "  "
    wrapped = textwrap.wrap(text, max(NOTE_MIN, width - len(prefix)),
                            subsequent_indent="  ", break_on_hyphens=False)
    note = Text()
    for i, part in enumerate(wrapped):
        note.append(("\n" if i else "") + prefix, style="dim")
        note.append(part, style=style)
    return note


def flatten(nodes: list[Node]) -> list[Row]:
    """Depth-first (node, depth, tree guide) rows; top-level spans have no guide."""
    rows: list[Row] = []

    def walk(node: Node, depth: int, prefix: str, last: bool) -> None:
        guide = "" if depth == 0 else prefix + ("└─ " if last else "├─ ")
        rows.append((node, depth, guide))
        below = "" if depth == 0 else prefix + ("   " if last else "│  ")
        for i, child in enumerate(node.children):
            walk(child, depth + 1, below, i == len(node.children) - 1)

    for node in nodes:
        walk(node, 0, "", True)
    return rows


def _continuation(guide: str) -> str:
    """The guide of a line under a span's own line (its notes)."""
    return guide.replace("├─", "│ ").replace("└─", "  ")


def _bar(span: StoredSpan, start_ns: int, total_ns: int, width: int) -> str:
    if total_ns <= 0:
        return "▏"
    begin = int((span.start_ns - start_ns) / total_ns * width)
    length = max(1, round(span.duration_ns / total_ns * width))
    begin = min(begin, width - 1)
    return " " * begin + "█" * min(length, width - begin)


def duration(ns: int) -> str:
    """A duration as a person reads it: 412µs, 12.3ms, 1.24s, 2m03s."""
    if ns < 1_000_000:
        return f"{ns / 1000:.0f}µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.1f}ms"
    if ns < 60 * 10**9:
        return f"{ns / 1e9:.2f}s"
    minutes, seconds = divmod(ns // 10**9, 60)
    return f"{minutes}m{seconds:02d}s"
