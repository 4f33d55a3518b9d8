"""Upstream's import path ``horovod.runner.common.util.tiny_shell_exec``: run a short shell command and return
its output, on :func:`horovod.runner.common.util.safe_shell_exec.execute`."""
from __future__ import annotations

import io
import logging
from typing import Mapping, Optional, Tuple

from . import safe_shell_exec

log = logging.getLogger(__name__)


def execute(command: str, env: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, int]]:
    """``(stdout and stderr together, exit code)`` of the shell command, or None when it could not be run."""
    output = io.StringIO()
    try:
        exit_code = safe_shell_exec.execute(command, env=env, stdout=output, stderr=output)
        return output.getvalue(), exit_code
    except Exception:
        log.warning("could not run %r", command, exc_info=True)
        return None
    finally:
        output.close()
