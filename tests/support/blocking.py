"""Seeing which collectives reach the engine as blocking calls (``Engine.submit_blocking``: those a fast round or
the carried path may take), for the bindings' tests that their blocking calls say they wait at once."""
from typing import List


def count_blocking(monkeypatch) -> List[str]:
    """The names of the ops submitted as blocking calls on the global set's engine from now on (a grouped
    allreduce's: the group's name; a list that fills as they come; ``monkeypatch`` undoes the wrapping at the test's
    end)."""
    from horovod.core import basics

    engine = basics.engine_for(None)
    names: List[str] = []
    submit = engine.submit_blocking

    def counted(entry) -> None:
        names.append(entry.name)
        submit(entry)

    submit_group = engine.submit_blocking_group

    def counted_group(entries) -> None:
        names.append(entries[0].request.group)
        submit_group(entries)

    monkeypatch.setattr(engine, "submit_blocking", counted)
    monkeypatch.setattr(engine, "submit_blocking_group", counted_group)
    return names


def every_blocking_call(hvd, x, copy) -> List[str]:
    """Run a binding's (``hvd``'s) eight blocking collectives once each on ``x`` (on ``copy(x)`` for the in-place
    ones), at any rank count; returns the names they reach the engine under."""
    hvd.allreduce(x, op=hvd.Sum, name="bl.ar")
    hvd.allreduce_(copy(x), op=hvd.Sum, name="bl.ar_")
    hvd.broadcast(x, 0, name="bl.bc")
    hvd.broadcast_(copy(x), 0, name="bl.bc_")
    hvd.allgather(x, name="bl.ag")
    hvd.reducescatter(x, op=hvd.Sum, name="bl.rs")
    hvd.grouped_allreduce([x, x], op=hvd.Sum, name="bl.gar")
    hvd.grouped_allreduce_([copy(x), copy(x)], op=hvd.Sum, name="bl.gar_")
    return ["allreduce.bl.ar", "allreduce.bl.ar_", "broadcast.bl.bc", "broadcast.bl.bc_", "allgather.bl.ag",
            "reducescatter.bl.rs", "grouped_allreduce.bl.gar", "grouped_allreduce.bl.gar_"]
