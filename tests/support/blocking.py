"""Seeing which collectives reach the engine as blocking calls (``Engine.submit_blocking``: those a fast round or
the carried path may take), for the bindings' tests that their blocking calls say they wait at once."""
from typing import List


def count_blocking(monkeypatch) -> List[str]:
    """The names of the ops submitted as blocking calls on the global set's engine from now on (a list that fills
    as they come; ``monkeypatch`` undoes the wrapping at the test's end)."""
    from horovod.core import basics

    engine = basics.engine_for(None)
    names: List[str] = []
    submit = engine.submit_blocking

    def counted(entry) -> None:
        names.append(entry.name)
        submit(entry)

    monkeypatch.setattr(engine, "submit_blocking", counted)
    return names
