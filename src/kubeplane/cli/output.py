"""How CLI commands print data: aligned tables, YAML and JSON documents, ages, and per-node errors.

Formats (``-o table|yaml|json``, see :data:`output_option`):

- ``table``: a header row then one row per item; columns are separated by at least three spaces
  (the original's layout), trailing blanks removed. Streaming tables (``get -w``) print each row
  as it arrives, so a column only widens for the rows after the first wider value.
- ``yaml``: one YAML document per item, separated by ``---`` lines; lists are indented under their
  key, keys keep the order the node sent.
- ``json``: one compact JSON object per line (JSON Lines), so a watch can be read line by line
  and ``jq`` handles either form; nothing wraps the objects in a list.

Errors go to stderr as ``Error: node NODE: message (CODE)`` followed by one indented line per field
error (:func:`error_text`).
"""

from __future__ import annotations

import datetime
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import click
from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import LiteralScalarString

Format = Literal["table", "yaml", "json"]
FORMATS: tuple[Format, ...] = ("table", "yaml", "json")
#: Spaces between table columns.
COLUMN_GAP = 3

F = TypeVar("F", bound=Callable[..., Any])


def output_option(function: F) -> F:
    """The ``-o/--output table|yaml|json`` option of commands that print data."""
    return click.option(
        "-o",
        "--output",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="Output format: an aligned table, YAML documents, or one JSON object per line.",
    )(function)


# --- tables -----------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Render an aligned table (see the module docstring); ends with a newline."""
    all_rows = [list(headers), *(list(row) for row in rows)]
    widths = [max(len(row[index]) for row in all_rows) for index in range(len(headers))]
    return "".join(_line(row, widths) + "\n" for row in all_rows)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    gap = " " * COLUMN_GAP
    return gap.join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()


class StreamingTable:
    """A table printed row by row; widths start at the headers' and grow with the data seen."""

    def __init__(self, headers: Sequence[str]) -> None:
        self.headers = list(headers)
        self.widths = [len(header) for header in headers]
        self._header_printed = False

    def row(self, cells: Sequence[str]) -> str:
        """The text to print for one row (the header first, the first time)."""
        self.widths = [max(width, len(cell)) for width, cell in zip(self.widths, cells, strict=True)]
        text = _line(cells, self.widths) + "\n"
        if not self._header_printed:
            self._header_printed = True
            text = _line(self.headers, self.widths) + "\n" + text
        return text


# --- documents --------------------------------------------------------------------------------


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    # Lists indented under their key ("key:\n    - item"), as ``get -o yaml`` always has shown them.
    yaml.indent(mapping=4, sequence=6, offset=4)
    yaml.width = 1 << 16  # certificates and tokens stay on one line
    yaml.allow_unicode = True
    # The round-trip dumper writes None as an empty value; "null" says it was sent that way.
    yaml.representer.add_representer(
        type(None), lambda representer, _: representer.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return yaml


def _literal_blocks(value: Any) -> Any:
    # Multi-line strings (machine configs, PEMs, manifests) read best as literal blocks.
    if isinstance(value, str) and "\n" in value:
        return LiteralScalarString(value)
    if isinstance(value, Mapping):
        return {key: _literal_blocks(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_literal_blocks(item) for item in value]
    return value


def yaml_document(document: object) -> str:
    """One YAML document (4-space indent, keys in the given order)."""
    stream = io.StringIO()
    _yaml().dump(_literal_blocks(document), stream)
    return stream.getvalue()


def yaml_documents(documents: Iterable[object]) -> str:
    """Several YAML documents separated by ``---`` lines."""
    return "---\n".join(yaml_document(document) for document in documents)


def json_line(document: object) -> str:
    """One compact JSON object and a newline."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n"


def documents(items: Sequence[object], output: Format) -> str:
    """``items`` in the YAML or JSON form (``output`` must not be ``table``)."""
    if output == "yaml":
        return yaml_documents(items)
    return "".join(json_line(item) for item in items)


# --- ages -------------------------------------------------------------------------------------


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")


def parse_duration(value: str) -> float:
    """``10m``, ``1h30m``, ``90s`` or ``90`` -> seconds."""
    match = _DURATION.match(value.strip())
    if not value.strip() or match is None:
        raise click.BadParameter(f"{value!r} is not a duration: use e.g. 90s, 5m or 1h")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def duration(seconds: float) -> str:
    """A short duration in the original's style: ``45s``, ``3m21s``, ``2h5m``, ``3d4h``."""
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _when(value: str | float | None) -> datetime.datetime | None:
    """A point in time from an RFC 3339 string or Unix seconds (the agent sends either)."""
    if isinstance(value, bool) or value is None or value == "":
        return None
    if isinstance(value, int | float):
        return datetime.datetime.fromtimestamp(value, datetime.UTC)
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def timestamp(value: str | float | None) -> str:
    """RFC 3339 in UTC to the second (``2021-03-09T13:57:11Z``); unparseable text as it is."""
    when = _when(value)
    if when is None:
        return "" if value is None else str(value)
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def age(value: str | float | None, *, now: datetime.datetime | None = None) -> str:
    """``3m21s ago`` for a point in time (see :func:`timestamp`); the text itself when it does not parse."""
    when = _when(value)
    if when is None:
        return "" if value is None else str(value)
    current = now or datetime.datetime.now(datetime.UTC)
    return f"{duration((current - when).total_seconds())} ago"


# --- errors -----------------------------------------------------------------------------------


def error_text(error: Exception, *, where: str = "") -> str:
    """An API error for the user: where it happened, the message, then one line per field error.

    The node API folds field errors into the message as ``msg: a: x; b: y``; listing them one per
    line reads better when a config has many problems, so the folded copy is dropped here.
    ``where`` (``node N`` / ``endpoint E``) labels errors that do not name their node.
    """
    error_node = getattr(error, "node", None)
    fields: Sequence[tuple[str, str]] = getattr(error, "fields", ())
    code = getattr(error, "code", None)
    if code is None:
        return f"{where}: {error}" if where else str(error)
    message = str(getattr(error, "message", error))
    details = "; ".join(f"{path}: {problem}" for path, problem in fields)
    if fields and message.endswith(": " + details):
        message = message[: -len(details) - 2]
    where = f"node {error_node}" if error_node else where
    text = f"{f'{where}: ' if where else ''}{message} ({code})"
    return "\n".join([text + (":" if fields else ""), *(f"  {path}: {problem}" for path, problem in fields)])


def print_error(error: Exception, *, where: str = "") -> None:
    """Print an error to stderr in the form click uses for its own errors (``Error: ...``)."""
    click.echo(f"Error: {error_text(error, where=where)}", err=True)


def node_label(node: str, many: bool) -> str:
    """``NODE: `` in front of free-form lines when several nodes answer, nothing otherwise."""
    return f"{node}: " if many and node else ""


def mapping_lines(data: Mapping[str, Any], *, indent: str = "    ") -> list[str]:
    """``Key:   value`` lines, keys capitalised and values aligned (the ``version`` layout)."""
    labels = {key: f"{key[:1].upper()}{key[1:]}:" for key in data}
    width = max((len(label) for label in labels.values()), default=0)
    return [f"{indent}{labels[key].ljust(width)}   {value}" for key, value in data.items()]
