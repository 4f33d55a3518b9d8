"""The words that describe the code stay true: every module under src/horovod is in a layer of the import contract
(pyproject.toml), and no knob marked inert (accepted, no effect) is read anywhere."""
import re
from pathlib import Path

from horovod.common import config

try:
    import tomllib
except ImportError:         # Python < 3.11: import-linter's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
# The package root, its version, and core's package docstring: nothing in them imports across layers.
BESIDE = {"horovod", "horovod.version", "horovod.core"}


def modules():
    for path in sorted((SRC / "horovod").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def contract_names():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    names = set()
    for contract in contracts:
        for entry in contract.get("layers", []):
            names.update(n.strip() for n in re.split(r"[:|]", entry))
        names.update(contract.get("source_modules", []))
    return names


def test_every_module_is_in_a_layer_of_the_import_contract():
    names = contract_names()
    outside = [m for m in modules() if m not in BESIDE
               and not any(m == n or m.startswith(n + ".") for n in names)]
    assert not outside, (f"modules in no layer of pyproject.toml's import contract (add each to its layer, so that "
                         f"lint-imports checks its imports): {outside}")


def test_no_inert_knob_is_read_anywhere():
    """An inert knob is accepted with no effect (config.py says so, and log_inert_knobs tells the user); a module
    that reads one makes that a lie. Only config.py (the declaration) and options.py (the flag that exports it)
    may name it."""
    inert = [k.name for k in config.KNOBS.values() if k.inert]
    assert inert, "no knob is marked inert: the test checks nothing"
    allowed = {SRC / "horovod" / "common" / "config.py", SRC / "horovod" / "common" / "options.py"}
    readers = [f"{path.relative_to(ROOT)}: {name}" for path in sorted((SRC / "horovod").rglob("*.py"))
               if path not in allowed for name in inert if name in path.read_text()]
    assert not readers, f"inert knobs read by the code (drop inert=True, or stop reading them): {readers}"
