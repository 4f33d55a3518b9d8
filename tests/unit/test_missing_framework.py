"""``import horovod.<binding>`` without its framework raises an ImportError that names the extra to install, not a
bare "No module named ..." from deep inside the binding. Each import runs in a fresh interpreter in which the
framework is made unimportable (``sys.modules[name] = None``), so this works whether it is installed or not."""
import subprocess
import sys

import pytest

CASES = [("horovod.torch", "torch", "torch"), ("horovod.tensorflow", "tensorflow", "tensorflow"),
         ("horovod.tensorflow.keras", "tensorflow", "tensorflow"), ("horovod.keras", "keras", "keras"),
         ("horovod.jax", "jax", "jax"), ("horovod.mxnet", "mxnet", "mxnet"), ("horovod.spark", "pyspark", "spark"),
         ("horovod.ray", "ray", "ray")]


@pytest.mark.parametrize("binding,module,extra", CASES, ids=[c[0] for c in CASES])
def test_a_missing_framework_is_named_with_its_extra(binding, module, extra):
    code = (f"import importlib.util, sys\n"
            f"real = importlib.util.find_spec\n"
            f"importlib.util.find_spec = lambda name, *a: None if name == {module!r} else real(name, *a)\n"
            f"sys.modules[{module!r}] = None\n"
            f"try:\n    import {binding}\nexcept ImportError as exc:\n    print('MESSAGE', exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MESSAGE" in result.stdout, f"importing {binding} without {module} did not fail: {result.stdout}"
    assert f'pip install "horovod[{extra}]"' in result.stdout and binding.split(".")[1] in result.stdout, result.stdout
