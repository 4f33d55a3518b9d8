"""Read a Horovod timeline file: a Chrome-tracing JSON array, possibly still being written or cut short.

Rank 0 keeps the file valid JSON at every moment (it closes the array with ``]`` after each event), so a live
file normally parses as is. A job that was killed can leave the last event half written, or the array without
its ``]``; :func:`parse_timeline_text` then keeps every complete event and says what it dropped in a note.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Union

logger = logging.getLogger(__name__)

# One event is a few hundred bytes; an unreadable tail much longer than this is corruption, not a cut event.
_MAX_PARTIAL_EVENT_CHARS = 64 * 1024
_WHITESPACE = " \t\r\n"

Event = Dict[str, Any]


class TimelineError(Exception):
    """The file cannot be read as a timeline; the message says why and what to do."""


@dataclass
class LoadedTimeline:
    """The events of a timeline file, plus notes on anything that had to be skipped to read it."""

    events: List[Event]
    source: str
    notes: List[str] = field(default_factory=list)
    truncated: bool = False


def load_timeline(path: Union[str, os.PathLike[str]]) -> LoadedTimeline:
    """Read the timeline at ``path``; raise :class:`TimelineError` if it is missing or is not a timeline."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise TimelineError(f"{source}: no such file; pass the path that HOROVOD_TIMELINE named "
                            f"when the job ran.") from None
    except IsADirectoryError:
        raise TimelineError(f"{source} is a directory; pass the timeline file itself.") from None
    except OSError as exc:
        raise TimelineError(f"cannot read {source}: {exc.strerror or exc}.") from None
    return parse_timeline_text(text, source)


def load_events(path: Union[str, os.PathLike[str]]) -> List[Event]:
    """Return the list of event objects in the timeline at ``path`` (notes on skipped parts are logged)."""
    loaded = load_timeline(path)
    for note in loaded.notes:
        logger.warning("%s", note)
    return loaded.events


def parse_timeline_text(text: str, source: str = "<timeline>") -> LoadedTimeline:
    """Parse the text of a timeline, tolerating a missing ``]`` and an incomplete last event."""
    if not text.strip():
        raise TimelineError(f"{source} is empty: no event recorded yet. If the job is still starting, "
                            f"try again in a moment; a timeline starts with '['.")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return _recover(text, source, exc)
    return _from_json(data, source)


def _from_json(data: Any, source: str) -> LoadedTimeline:
    if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        data = data["traceEvents"]  # Chrome's object form, as saved by chrome://tracing
    if not isinstance(data, list):
        raise TimelineError(f"{source} is JSON but not a timeline: expected an array of trace events, "
                            f"found a JSON {type(data).__name__}.")
    return _keep_objects(data, LoadedTimeline(events=[], source=source))


def _keep_objects(items: List[Any], loaded: LoadedTimeline) -> LoadedTimeline:
    events = [item for item in items if isinstance(item, dict)]
    skipped = len(items) - len(events)
    if skipped:
        loaded.notes.append(f"ignored {skipped} array entries that are not event objects.")
    if items and not events:
        raise TimelineError(f"{loaded.source} is not a timeline: its array holds no event objects "
                            f"(the first entry is {items[0]!r}).")
    loaded.events = events
    return loaded


def _skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def _recover(text: str, source: str, error: json.JSONDecodeError) -> LoadedTimeline:
    """Read event by event up to the first one that does not parse, and describe what was left out."""
    index = _skip_whitespace(text, 0)
    if index >= len(text) or text[index] != "[":
        raise TimelineError(f"{source} is not a timeline: it is not valid JSON ({error.msg} at line "
                            f"{error.lineno} column {error.colno}) and does not start with '['.")
    decoder = json.JSONDecoder()
    items: List[Any] = []
    loaded = LoadedTimeline(events=[], source=source)
    index += 1
    closed = False
    tail_start = -1
    while True:
        index = _skip_whitespace(text, index)
        if index >= len(text):
            break
        char = text[index]
        if char == "]":
            closed = True
            index += 1
            break
        if char == ",":
            index += 1
            continue
        try:
            item, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            tail_start = index
            break
        items.append(item)

    if tail_start >= 0:
        tail = text[tail_start:]
        if not tail.startswith("{") and not any(isinstance(item, dict) for item in items):
            raise TimelineError(f"{source} is not a timeline: after '[' comes {text[1 + text.index('['):][:20]!r}, "
                                f"not an event object ({error.msg} at line {error.lineno} column {error.colno}).")
        loaded.truncated = True
        if tail.startswith("{") and len(tail) <= _MAX_PARTIAL_EVENT_CHARS:
            loaded.notes.append(f"the file was truncated: its last event is incomplete ({len(tail)} characters "
                                f"ignored); the job was probably killed while writing it. "
                                f"Read {len(items)} complete events.")
        else:
            loaded.notes.append(f"the file is unreadable from character {tail_start} on ({len(tail)} characters "
                                f"ignored): it is corrupt or was cut short. Read the {len(items)} events before it.")
    elif not closed:
        loaded.truncated = True
        loaded.notes.append("the file does not end with ']': the job was killed, or is still writing it. "
                            f"Read {len(items)} complete events.")
    else:
        rest = text[index:].strip()
        if rest:
            loaded.notes.append(f"ignored {len(rest)} characters after the closing ']'.")
    return _keep_objects(items, loaded)
