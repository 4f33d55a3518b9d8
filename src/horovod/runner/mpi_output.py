"""mpirun's output as ``horovodrun --mpi`` forwards it: each line to the console unchanged, the last lines of
each rank (for the failure report), mpirun's own messages, and each rank's lines in ``--output-filename``
files. MPICH's per-write tags are put back into whole lines first (:class:`HydraDemux`).
"""
from __future__ import annotations

import collections
import logging
import os
import re
import sys
import threading
from typing import IO, Deque, Dict, List, Optional, Tuple

from .output_tail import OutputTail
from .process import WorkerExit, pad_rank, split_lines

log = logging.getLogger(__name__)

# MPICH's tag for each write of a rank (``-prepend-pattern``): ``[<rank>]`` and the ASCII unit separator, which
# programs do not print, so the tags can be told from the ranks' own text. Intel MPI keeps ``-l`` (``[<rank>] ``).
MPICH_PREPEND_PATTERN = "[%r]\x1f"
_MPICH_TAG = re.compile(rb"\[(\d+)\]\x1f")
_MPICH_PARTIAL_TAG = re.compile(rb"\[\d*\]?\Z")   # what the end of a read may hold of a tag cut in two
# Where a rank's record ends when it has no newline: the next tag, or a message of mpiexec's own
# (``[mpiexec@host] Exit codes: ...``, ``[proxy:0@host] ...``), which Hydra writes right after it.
_MPICH_RECORD_END = re.compile(rb"\[\d+\]\x1f|\[(?:mpiexec|proxy:[^\]\s@]*)@[^\]\s]*\] ")


# ``[1,3]<stdout>: text`` (Open MPI 5 puts one space after the colon, 4 none), optionally after a timestamp.
_OMPI_TAG = re.compile(r"^(?:\[[^\]\[]*\])?\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")
# Intel MPI's ``-l``: ``[3] text``.
_HYDRA_TAG = re.compile(r"^\[(\d+)\] ?")
_RANK_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")   # a line of one rank, as process.split_lines cuts them
# The lines of MPICH's -print-all-exitcodes report (asked for by horovodrun, so not shown; the failure report
# says what they say): ``[mpiexec@host] Exit codes: [node1] 0,0``, then ``[node2] 0,0`` per further host.
_EXIT_CODES_LINE = re.compile(r"\[mpiexec@[^\]]*\] Exit codes:(?: \[[^\]\s]+\] -?\d+(?:,-?\d+)*)?\s*")
_EXIT_CODES_MORE = re.compile(r"\[[^\]\s]+\] -?\d+(?:,-?\d+)*\s*")


class HydraDemux:
    """Puts the output of MPICH's mpiexec (run with ``-prepend-pattern "[%r]\\x1f"``) back into each rank's lines.

    Hydra writes every chunk it reads from a rank, and every line within it, after the rank's tag, whether or not
    the chunk ends a line; a line that a rank writes in pieces comes out as ``[0]<US>loss[1]<US>loss[0]<US>: 1\\n``.
    Read back as records (a tag, then the rank's bytes up to a newline, the next tag or a ``[mpiexec@host]``
    message), the pieces are joined per rank and cut into lines again (``\\n``, ``\\r\\n`` or a lone
    ``\\r``). Text outside any record (mpiexec's own messages) comes out as untagged lines, rank None. One
    instance per stream.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._rank: Optional[int] = None        # the rank whose record is open, if one is
        self._pending: Dict[int, bytes] = {}     # each rank's unfinished line

    def feed(self, data: bytes) -> List[Tuple[Optional[int], bytes]]:
        """The lines that ``data`` completes, in order: (rank or None, the line with its terminator)."""
        out: List[Tuple[Optional[int], bytes]] = []
        buf = self._buf + data
        pos, n = 0, len(buf)
        while pos < n:
            if self._rank is None:
                match = _MPICH_TAG.match(buf, pos)
                if match:
                    self._rank = int(match.group(1))
                    pos = match.end()
                    continue
                if _MPICH_PARTIAL_TAG.match(buf, pos):
                    break                               # a tag cut by the read: wait for the rest
                newline = buf.find(b"\n", pos)
                if newline < 0:
                    break                               # an untagged line in progress
                tag = _MPICH_TAG.search(buf, pos, newline)
                if tag is not None:                     # not expected: mpiexec ends its own lines
                    out.append((None, buf[pos:tag.start()] + b"\n"))
                    pos = tag.start()
                    continue
                out.append((None, buf[pos:newline + 1]))
                pos = newline + 1
                continue
            newline = buf.find(b"\n", pos)
            end = newline + 1 if newline >= 0 else n
            nxt = _MPICH_RECORD_END.search(buf, pos, end)
            if nxt is not None:
                stop = nxt.start()
            elif newline >= 0:
                stop = end
            else:
                # keep back what may be the start of the next tag or mpiexec message (only whole lines come
                # out, so keeping bytes back delays nothing)
                cut = buf.rfind(b"[", max(pos, n - 256), n)
                stop = cut if cut >= 0 else n
            out.extend(self._append(self._rank, buf[pos:stop]))
            pos = stop
            if nxt is None and newline < 0:
                break
            self._rank = None
        self._buf = buf[pos:]
        return out

    def close(self) -> List[Tuple[Optional[int], bytes]]:
        """What is left at the end of the stream: an untagged remainder, then each rank's unfinished line."""
        out: List[Tuple[Optional[int], bytes]] = []
        if self._buf:
            if self._rank is None:
                out.append((None, self._buf))
            else:
                self._pending[self._rank] = self._pending.get(self._rank, b"") + self._buf
        self._buf, self._rank = b"", None
        for rank in sorted(self._pending):
            if self._pending[rank]:
                out.append((rank, self._pending[rank]))
        self._pending.clear()
        return out

    def _append(self, rank: int, data: bytes) -> List[Tuple[Optional[int], bytes]]:
        text = self._pending.get(rank, b"") + data
        out: List[Tuple[Optional[int], bytes]] = []
        end = 0
        for match in _RANK_LINE.finditer(text):
            if match.end() == len(text) and text.endswith(b"\r"):
                break                                   # maybe the first half of \r\n
            out.append((rank, match.group()))
            end = match.end()
        self._pending[rank] = text[end:]
        return out


class MpirunOutput:
    """Forwards mpirun's output to the console unchanged, remembers the last lines of each rank and of mpirun's
    own messages, and writes each rank's lines (untagged) to ``output_dir/rank.<rank>/<stream>`` if asked."""

    UNTAGGED_LINES = 400

    def __init__(self, num_proc: int, output_dir: Optional[str], stdout: Optional[IO[str]],
                 stderr: Optional[IO[str]], hydra: bool = False, demux: bool = False,
                 strip_space: bool = False) -> None:
        """``hydra``: Hydra's ``[rank] `` tags (MPICH, Intel MPI) instead of Open MPI's; ``demux``: MPICH's
        per-write tags, put back into lines (:class:`HydraDemux`); ``strip_space``: Open MPI 5's space after the
        tag."""
        self._hydra = hydra
        self._demux = demux
        self._in_exit_codes = {"stdout": False, "stderr": False}
        self._strip_space = strip_space
        self._num_proc = num_proc
        self._output_dir = output_dir
        self._targets = {"stdout": stdout, "stderr": stderr}
        self._lock = threading.Lock()
        self.rank_tails: Dict[int, OutputTail] = collections.defaultdict(OutputTail)
        # per stream: mpirun writes a report as consecutive lines of one stream, but the two streams interleave
        self.untagged: Dict[str, Deque[str]] = {name: collections.deque(maxlen=self.UNTAGGED_LINES)
                                                for name in ("stdout", "stderr")}
        self._files: Dict[Tuple[int, str], IO[bytes]] = {}

    def exit_info(self, rank: int, hostname: str, returncode: int, command_text: str) -> WorkerExit:
        """The failure report's view of ``rank``: its last lines and its last exception's first lines."""
        tail = self.rank_tails.get(rank) or OutputTail()
        return WorkerExit(rank, hostname, returncode, command_text, list(tail.lines), tail.unseen_exception())

    def _target(self, stream: str) -> IO[str]:
        return self._targets[stream] or (sys.stdout if stream == "stdout" else sys.stderr)

    def pump(self, pipe: IO[bytes], stream: str) -> None:
        try:
            if self._demux:
                self._pump_demux(pipe, stream)
            else:
                for raw in split_lines(pipe):
                    self._line(raw, stream)
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    def _pump_demux(self, pipe: IO[bytes], stream: str) -> None:
        demux = HydraDemux()
        fd = pipe.fileno()
        try:
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                for rank, raw in demux.feed(data):
                    self._rank_line(rank, raw, stream)
        finally:
            for rank, raw in demux.close():
                self._rank_line(rank, raw, stream)

    def _rank_line(self, rank: Optional[int], raw: bytes, stream: str) -> None:
        """A line put back together by HydraDemux: shown as ``[rank] text`` (as ``-l`` would show it)."""
        text = raw.decode("utf-8", "replace")
        content = text.rstrip("\r\n")
        if rank is None:
            if _EXIT_CODES_LINE.fullmatch(content) or (self._in_exit_codes[stream]
                                                       and _EXIT_CODES_MORE.fullmatch(content)):
                self._in_exit_codes[stream] = True
                text = ""
            else:
                self._in_exit_codes[stream] = False
            self._record(text, stream, None, stream, content, content)
            return
        shown = f"[{rank}] {content}"
        self._record(shown + (text[len(content):] or "\n"), stream, rank, stream, content, shown)

    def _line(self, raw: bytes, stream: str) -> None:
        text = raw.decode("utf-8", "replace")
        shown = text.rstrip("\r\n")
        rank, rank_stream, content = self._parse_tag(shown, stream)
        self._record(text, stream, rank, rank_stream, content, shown)

    def _record(self, text: str, stream: str, rank: Optional[int], rank_stream: str, content: str,
                shown: str) -> None:
        """Show ``text`` on the console's ``stream``; remember ``shown``; write ``content`` to the rank's file."""
        target = self._target(stream)
        try:
            if text:
                target.write(text)
                target.flush()
        except (OSError, ValueError):
            pass  # the console went away: keep draining so that mpirun never blocks
        with self._lock:
            if rank is None:
                self.untagged[stream].append(shown)
                return
            self.rank_tails[rank].add(content, shown, rank_stream)
            if self._output_dir is not None:
                self._write_file(rank, rank_stream, content + "\n")

    def _parse_tag(self, line: str, stream: str) -> Tuple[Optional[int], str, str]:
        if self._hydra:
            match = _HYDRA_TAG.match(line)
            if match is None:
                return None, stream, line
            return int(match.group(1)), stream, line[match.end():]
        match = _OMPI_TAG.match(line)
        if match is None:
            return None, stream, line
        content = line[match.end():]
        if self._strip_space and content.startswith(" "):
            content = content[1:]
        rank_stream = "stderr" if match.group(2) == "stderr" else "stdout"
        return int(match.group(1)), rank_stream, content

    def _write_file(self, rank: int, stream: str, text: str) -> None:
        key = (rank, stream)
        f = self._files.get(key)
        if f is None:
            directory = os.path.join(self._output_dir, f"rank.{pad_rank(rank, self._num_proc)}")
            try:
                os.makedirs(directory, exist_ok=True)
                f = open(os.path.join(directory, stream), "wb")
            except OSError as exc:
                log.warning("cannot write the output of rank %d to %s: %s", rank, directory, exc)
                self._output_dir = None
                return
            self._files[key] = f
        f.write(text.encode("utf-8"))
        f.flush()

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                try:
                    f.close()
                except OSError:
                    pass
            self._files.clear()
