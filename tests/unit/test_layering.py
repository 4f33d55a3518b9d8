"""The import contract (pyproject's [tool.importlinter]) holds, and it does catch an upward import."""
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def lint(pythonpath: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-logo", "--no-cache", "--config", str(config)], cwd=str(pythonpath),
                          env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=100)


def test_the_tree_keeps_the_contract():
    result = lint(ROOT / "src", ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("common/types.py", "import horovod.core.engine", "horovod.common is not allowed to import horovod.core.engine"),
    ("backends/local.py", "from horovod.core import ops", "horovod.backends is not allowed to import horovod.core"),
    ("runner/ssh.py", "import horovod.torch", "the runner and the timeline tool"),
])
def test_an_upward_import_breaks_it(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "src" / "horovod", tmp_path / "horovod", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "horovod" / module
    target.write_text(target.read_text() + f"\n{line}  # an upward import\n")
    result = lint(tmp_path, ROOT / "pyproject.toml")
    assert result.returncode != 0
    assert broken in result.stdout, result.stdout


def test_a_cycle_through_a_type_checking_import_breaks_it(tmp_path):
    """An import made only for annotations still ties two modules together: the engine's helpers name what they
    need of it in protocols, and naming ``Engine`` under TYPE_CHECKING instead closes a cycle."""
    shutil.copytree(ROOT / "src" / "horovod", tmp_path / "horovod", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "horovod" / "core" / "engine" / "loops.py"
    target.write_text(target.read_text() + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                      "    from horovod.core.engine.engine import Engine  # a cycle\n")
    result = lint(tmp_path, ROOT / "pyproject.toml")
    assert result.returncode != 0
    assert "no import cycles" in result.stdout and ".loops -> .engine (1 import)" in result.stdout, result.stdout


def test_the_runner_does_not_import_the_package_root():
    """``horovod/__init__`` pulls in the op layer; the runner reads the version from horovod.version."""
    graph = grimp.build_graph("horovod")
    importers = {m for m in graph.find_modules_that_directly_import("horovod") if m.startswith("horovod.runner")}
    assert importers == set()
    assert "horovod.version" in graph.find_modules_directly_imported_by("horovod.runner.launch")
