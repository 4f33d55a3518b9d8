"""The Horovod launcher: ``horovodrun`` (:mod:`horovod.runner.launch`) and the Python API :func:`run`.

Importing this package is cheap: the launcher's modules are imported only when :func:`run` is called.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from horovod.common import options


class _HorovodArgs:
    """The arguments ``horovodrun`` would have parsed, for :func:`run` (upstream's class of this name).

    One attribute per destination of the option table (:data:`horovod.common.options.OPTIONS`), at the value
    ``horovod.run`` gives it when its keyword is not passed (None for most), plus ``run_func`` and
    ``executable``.
    """

    def __init__(self) -> None:
        for option in options.OPTIONS:
            if option.kind != options.VERSION:
                setattr(self, option.dest, option.run_default)
        self.run_func: Optional[Callable[[], Any]] = None
        self.executable: Optional[str] = None

    @classmethod
    def from_keywords(cls, keywords: Dict[str, Any]) -> _HorovodArgs:
        """The arguments with each option whose ``horovod.run`` keyword is in ``keywords`` (and not None) set."""
        hargs = cls()
        for option in options.OPTIONS:
            if option.keyword is not None and keywords.get(option.keyword) is not None:
                setattr(hargs, option.dest, keywords[option.keyword])
        return hargs


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Optional[Dict[str, Any]] = None,
    num_proc: Optional[int] = None,
    min_num_proc: Optional[int] = None,
    max_num_proc: Optional[int] = None,
    slots: Optional[int] = None,
    reset_limit: Optional[int] = None,
    cooldown_range: Optional[Tuple[int, int]] = None,
    hosts: Optional[str] = None,
    hostfile: Optional[str] = None,
    host_discovery_script: Optional[str] = None,
    start_timeout: Optional[int] = None,
    ssh_port: Optional[int] = None,
    ssh_identity_file: Optional[str] = None,
    disable_cache: Optional[bool] = None,
    output_filename: Optional[str] = None,
    verbose: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    use_mpi: Optional[bool] = None,
    mpi_args: Optional[str] = None,
    network_interface: Optional[str] = None,
    network_interfaces: Optional[Any] = None,
    executable: Optional[str] = None,
    np: Optional[int] = None,
    min_np: Optional[int] = None,
    max_np: Optional[int] = None,
) -> List[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` (or ``np``) Horovod ranks and return their results by rank.

    The function is cloudpickled and shipped to each rank through the job's authenticated rendezvous store;
    each rank runs ``python -m horovod.runner.run_task`` (with ``executable``, default this interpreter).
    Without ``hosts``/``hostfile`` all ranks run on this machine.

    Raises ValueError when both ``hosts`` and ``hostfile``, or both ``use_gloo`` and ``use_mpi``, are given;
    RuntimeError naming the rank (with its traceback) when the function raised on a rank; RuntimeError naming
    the first failed rank when a rank died; a failure's message starts with upstream's sentence. With
    ``use_mpi=True`` the ranks are started by ``mpirun`` (see :mod:`horovod.runner.mpi_run`); with ``min_np`` /
    ``max_np`` and ``host_discovery_script`` the job is elastic, and the results are those of its last round.
    """
    from horovod.runner import launch

    keywords = _resolve_keywords(dict(locals()))
    call_args, call_kwargs = tuple(args), dict(kwargs or {})

    def wrapped_func():
        return func(*call_args, **call_kwargs)

    hargs = _HorovodArgs.from_keywords(keywords)
    hargs.run_func = wrapped_func
    hargs.executable = executable
    return launch._run(hargs)


def _resolve_keywords(given: Dict[str, Any]) -> Dict[str, Any]:
    """``run``'s keywords checked, with each alias pair (``num_proc``/``np``, ``min_num_proc``/``min_np``,
    ``max_num_proc``/``max_np``, ``network_interface``/``network_interfaces``) resolved to the table's keyword."""
    import warnings

    if given["hosts"] is not None and given["hostfile"] is not None:
        raise ValueError("Argument hosts and hostfile cannot be given together, only one of them.")
    if given["use_gloo"] and given["use_mpi"]:
        raise ValueError("Argument use_gloo and use_mpi cannot be given together, only one of them.")
    resolved = dict(given)
    for long, short in (("num_proc", "np"), ("min_num_proc", "min_np"), ("max_num_proc", "max_np")):
        if given[long] is not None and given[short] is not None and given[long] != given[short]:
            raise ValueError(f"{long}={given[long]} and {short}={given[short]} disagree; give only one of them.")
        resolved[short] = given[long] if given[long] is not None else given[short]
    if given["network_interface"] is not None:
        warnings.warn("network_interface is deprecated, use network_interfaces instead", DeprecationWarning,
                      stacklevel=3)
        resolved["network_interfaces"] = given["network_interfaces"] or given["network_interface"]
    return resolved
