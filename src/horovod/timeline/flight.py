"""Compare the ranks' flight records: ``python -m horovod.timeline flight DIR``.

Every rank writes ``rank.<rank>.json`` into the job's folder on a stall or deadlock report, an abort or SIGUSR1
(``HOROVOD_FLIGHT_RECORDER_SIZE``, docs/timeline.md). Each record lists, per process set, the last collectives the
rank submitted, numbered per set alike on every rank, with the time each reached a state (submitted, negotiated,
started, done, failed). Per process set this finds the first number at which the ranks disagree: a rank that never
submitted it, ranks that submitted different collectives under it, or ranks in different states; a number done on
every rank counts as agreement even under different names, since ranks may run collectives in different orders
and what completed held nobody up. It names which
ranks submitted, were told to run (negotiated), started, finished and failed it, which never came, and each rank's
last completed collective. A collective done on any rank was submitted by every rank, so a rank that wrote no
record (killed) is known to have come as far as the others completed together, and is named as the one that never
came when no rank saw the first divergent collective negotiated.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from horovod.common import flight_records

STATES = ("submitted", "negotiated", "started", "done", "failed")


class FlightError(Exception):
    """The folder holds no readable flight record; the message says why."""


@dataclasses.dataclass
class Collective:
    """One collective submitted under the divergent number, and what each rank did with it."""

    name: str
    op: str
    detail: str                                 # dtype, shape, bytes, reduce op
    by_state: Dict[str, List[int]]              # state -> ranks that reached it


@dataclasses.dataclass
class Divergence:
    seq: int
    collectives: List[Collective]
    never_came: List[int]           # ranks whose record ends before this number
    no_record: List[int]            # members that wrote no record
    no_record_never_came: bool      # ... and are known not to have come (nobody saw it negotiated)


@dataclasses.dataclass
class SetAnalysis:
    """One process set: its members, the ranks that wrote a record, and where they first disagree."""

    set_id: int
    ranks: List[int]
    recorded: List[int]
    no_record: List[int]                        # members that wrote no record
    last_done: Dict[int, Optional[int]]         # rank -> its last completed sequence number
    last: Dict[int, Optional[dict]]             # rank -> its last entry
    first_common: int                           # the oldest number every record still holds
    divergence: Optional[Divergence]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_records(folder: str) -> Tuple[Dict[int, dict], List[str]]:
    """Every rank's record in ``folder`` (by rank) and notes on files that could not be read."""
    files = flight_records.record_files(folder)
    if not os.path.isdir(folder):
        raise FlightError(f"{folder} is not a folder; give the folder the ranks wrote their flight records into "
                          "(HOROVOD_FLIGHT_RECORDER_DIR, named in horovodrun's failure message).")
    records, notes = {}, []
    for rank, path in files.items():
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            notes.append(f"{os.path.basename(path)} is unreadable ({exc}); rank {rank} is left out")
            continue
        if doc.get("format") != flight_records.FORMAT:
            notes.append(f"{os.path.basename(path)} is not a Horovod flight record; left out")
            continue
        records[rank] = doc
    if not records:
        raise FlightError(f"no flight record (rank.<rank>.json) in {folder}")
    return records, notes


def _detail(entry: dict) -> str:
    parts = [f"{entry.get('dtype')} {entry.get('shape')}", f"{entry.get('bytes', 0)} B"]
    if entry.get("reduce_op"):
        parts.append(entry["reduce_op"])
    if entry.get("root_rank") is not None:
        parts.append(f"root {entry['root_rank']}")
    return ", ".join(parts)


def _same(entries: List[Optional[dict]]) -> bool:
    """Whether every rank has this number, for the same collective, in the same state."""
    first = entries[0]
    return first is not None and all(
        e is not None and (e["name"], e["op"], e["state"]) == (first["name"], first["op"], first["state"])
        for e in entries)


def analyze_set(set_id: int, parts: Dict[int, dict]) -> SetAnalysis:
    """Compare the records of one process set (``parts``: rank -> that set's part of the rank's record)."""
    members = sorted({r for part in parts.values() for r in part["ranks"]})
    recorded = sorted(parts)
    by_seq = {rank: {e["seq"]: e for e in part["entries"]} for rank, part in parts.items()}
    count = {rank: int(part.get("submitted", max(by_seq[rank], default=0))) for rank, part in parts.items()}
    # The oldest number every record still holds (rings that wrapped further drop the older ones).
    first_common = max((min(seqs) for seqs in by_seq.values() if seqs), default=1)
    last_done = {rank: max((s for s, e in seqs.items() if e["state"] == "done"), default=None)
                 for rank, seqs in by_seq.items()}
    last = {rank: (seqs[max(seqs)] if seqs else None) for rank, seqs in by_seq.items()}
    missing = [r for r in members if r not in parts]
    divergence = None
    newest = max(count.values(), default=0)
    settled_up_to = max((s for s in range(first_common, newest + 1)
                         if all(by_seq[r].get(s, {}).get("state") == "done" for r in recorded)), default=0)
    for seq in range(first_common, newest + 1):
        entries = [by_seq[rank].get(seq) for rank in recorded]
        # Done everywhere is settled, names aside (ranks may run collectives in different orders; what completed
        # held nobody up), and it needed every member, those without a record too; so is a number that ended
        # (done or failed, a mismatch say) everywhere before one done everywhere: the ranks went on together.
        # The same collective in the same other state everywhere is agreement, when every member wrote a record.
        states = [e["state"] if e is not None else None for e in entries]
        if all(s == "done" for s in states) or (seq < settled_up_to and all(s in ("done", "failed") for s in states)):
            continue
        if _same(entries) and not missing:
            continue
        divergence = _divergence(seq, recorded, by_seq, missing)
        break
    return SetAnalysis(set_id, members, recorded, missing, last_done, last, first_common, divergence)


def _divergence(seq: int, recorded: List[int], by_seq: Dict[int, Dict[int, dict]], missing: List[int]) -> Divergence:
    groups: Dict[Tuple[str, str], Collective] = {}
    never = []
    for rank in recorded:
        entry = by_seq[rank].get(seq)
        if entry is None:
            never.append(rank)
            continue
        key = (entry["name"], entry["op"])
        if key not in groups:
            groups[key] = Collective(entry["name"], entry["op"], _detail(entry), {s: [] for s in STATES})
        for state in STATES:
            if entry.get(f"{state}_at") is not None:
                groups[key].by_state[state].append(rank)
    negotiated = any(c.by_state["negotiated"] for c in groups.values())
    return Divergence(seq, list(groups.values()), never, missing, bool(missing) and not negotiated)


def analyze(records: Dict[int, dict]) -> List[SetAnalysis]:
    """Compare every process set found in the ranks' records."""
    sets: Dict[int, Dict[int, dict]] = {}
    for rank, doc in records.items():
        for part in doc.get("process_sets", []):
            sets.setdefault(int(part["id"]), {})[rank] = part
    return [analyze_set(set_id, sets[set_id]) for set_id in sorted(sets)]


def _ranks(ranks: List[int]) -> str:
    return ", ".join(map(str, ranks)) if ranks else "none"


def _when(t: Optional[float]) -> str:
    return "?" if t is None else datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def _header(folder: str, records: Dict[int, dict], notes: List[str]) -> List[str]:
    size = max((int(doc.get("size") or 0) for doc in records.values()), default=0)
    lines = [f"Flight records in {folder}: ranks {_ranks(sorted(records))}" + (f" of {size}" if size else "")]
    for rank, doc in sorted(records.items()):
        lines.append(f"  rank {rank}: {doc.get('reason')} at {_when(doc.get('written_at'))} on {doc.get('host')}, "
                     f"pid {doc.get('pid')}")
    lines.extend(f"  note: {note}" for note in notes)
    return lines


def _set_lines(result: SetAnalysis) -> List[str]:
    lines = ["", f"Process set {result.set_id} (ranks {_ranks(result.ranks)})"]
    div = result.divergence
    if div is None:
        final = next((e for e in result.last.values() if e is not None), None)
        who = "every rank" if not result.no_record else "every rank that wrote a record"
        names = {e["name"] for e in result.last.values() if e is not None}
        if final is None:
            lines.append("  no collective recorded")
        elif len(names) == 1:
            lines.append(f"  {who} agrees up to #{final['seq']}; the last, {final['op']} {final['name']}, is "
                         f"{final['state']} on each")
        else:
            lines.append(f"  {who} agrees up to #{final['seq']}, all done (the ranks ran some collectives in "
                         "different orders)")
        if result.no_record:
            lines.append(f"  no record from: {_ranks(result.no_record)}")
    else:
        if len(div.collectives) == 1:
            only = div.collectives[0]
            lines.append(f"  first divergence at #{div.seq}: {only.op} {only.name} ({only.detail})")
        else:
            lines.append(f"  first divergence at #{div.seq}: the ranks submitted different collectives")
        for collective in div.collectives:
            indent = "    "
            if len(div.collectives) > 1:
                lines.append(f"    {collective.op} {collective.name} ({collective.detail})")
                indent = "      "
            for state in STATES:
                lines.append(f"{indent}{state + ':':<12}{_ranks(collective.by_state[state])}")
        never = list(div.never_came)
        if div.no_record_never_came:
            never += [f"{r} (wrote no record)" for r in div.no_record]
        lines.append(f"    {'never came:':<12}{', '.join(map(str, never)) if never else 'none'}")
        if div.no_record and not div.no_record_never_came:
            lines.append(f"    {'no record:':<12}{_ranks(div.no_record)} (it submitted #{div.seq}: it was negotiated)")
    done = [f"rank {r}: " + (f"#{result.last_done[r]}" if result.last_done.get(r) is not None else "none")
            if r in result.recorded else f"rank {r}: no record" for r in result.ranks]
    lines.append("  last completed: " + ", ".join(done))
    return lines


def format_analysis(folder: str, records: Dict[int, dict], results: List[SetAnalysis],
                    notes: Optional[List[str]] = None) -> str:
    """The comparison as text, one block per process set."""
    lines = _header(folder, records, notes or [])
    for result in results:
        lines.extend(_set_lines(result))
    return "\n".join(lines) + "\n"


def compare_folder(folder: str) -> Tuple[str, Dict[str, Any]]:
    """Read and compare the records in ``folder``: (the text report, the same as a JSON-ready dict)."""
    records, notes = load_records(folder)
    results = analyze(records)
    data = {"folder": folder, "ranks": sorted(records), "notes": notes,
            "process_sets": [r.to_dict() for r in results]}
    return format_analysis(folder, records, results, notes), data
