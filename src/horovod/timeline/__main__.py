"""``python -m horovod.timeline summary FILE``: print where the time went in a Horovod timeline.
``python -m horovod.timeline flight DIR``: compare the ranks' flight records (horovod/timeline/flight.py).

Exit status: 0 on success, 2 when the file cannot be read as a timeline or the plot cannot be made (the reason is
printed on one line to stderr).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from horovod.timeline.flight import FlightError, compare_folder
from horovod.timeline.plot import PlotError, plot_summary, require_matplotlib
from horovod.timeline.reader import TimelineError
from horovod.timeline.report import format_report
from horovod.timeline.summary import summarize_file

PROG = "python -m horovod.timeline"


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; use 0 to list every tensor")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Tools for Horovod timeline files (HOROVOD_TIMELINE).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    summary = commands.add_parser(
        "summary", help="print where the time went: per op type, slowest tensors, straggler ranks",
        description="Print where the time went in a Horovod timeline: negotiation and op time per op type, "
                    "split into queue / memcpy / data plane / other; the slowest tensors; and which rank was "
                    "the last to submit. Reads a file that a running job is still writing, or one cut short.")
    summary.add_argument("file", metavar="FILE", help="the timeline file written by rank 0")
    summary.add_argument("--top", type=_count, default=10, metavar="N",
                         help="how many of the slowest tensors to list (default: 10; 0: all)")
    summary.add_argument("--plot", metavar="OUT.png", help="also draw the summary into this PNG (needs matplotlib)")
    summary.add_argument("--json", action="store_true", help="print the summary as JSON instead of tables")
    flight = commands.add_parser(
        "flight", help="compare the ranks' flight records: where they first diverge, per process set",
        description="Compare the flight records the ranks wrote (rank.<rank>.json, on a stall, an abort or "
                    "SIGUSR1): per process set, the first collective where the ranks diverge, which ranks "
                    "submitted, started and finished it, which never came, and each rank's last completed one.")
    flight.add_argument("folder", metavar="DIR", help="the job's folder of flight records (HOROVOD_FLIGHT_RECORDER_DIR)")
    flight.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "flight":
        return _flight(args)
    if args.command != "summary":
        parser.print_help(sys.stderr)
        return 2
    try:
        if args.plot:
            require_matplotlib()
        summary = summarize_file(args.file)
        if args.plot:
            plot_summary(summary, args.plot, top=args.top)
    except (TimelineError, PlotError) as exc:
        return _error(str(exc))
    try:
        if args.json:
            print(json.dumps(summary.to_dict(top=args.top), indent=2))
        else:
            print(format_report(summary, top=args.top), end="")
            if args.plot:
                print(f"\nPlot written to {args.plot}")
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _flight(args: argparse.Namespace) -> int:
    try:
        text, data = compare_folder(args.folder)
    except FlightError as exc:
        return _error(str(exc))
    _print(json.dumps(data, indent=2) + "\n" if args.json else text)
    return 0


def _print(text: str) -> None:
    try:
        print(text, end="")
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
