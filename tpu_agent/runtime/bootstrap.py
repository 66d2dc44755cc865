"""The per-rank entry point: activate the runtime, run the hooks, then run the user's code as ``python`` would.

``python -m tpu_agent.runtime.bootstrap SCRIPT ARGS...`` or ``... -m MODULE ARGS...``. Everything the user
can observe matches plain ``python``: ``sys.argv``, ``__main__`` (``runpy`` with ``run_name="__main__"``),
``sys.path[0]`` (the script's real directory, or the current directory for ``-m``), the working
directory, the exit code of ``sys.exit(n)``, and an uncaught exception's traceback (printed through
``sys.excepthook`` without this module's and runpy's frames, exit code 1). Ctrl-C ends the process by SIGINT,
as Python does, so the parent sees the same status.

Hooks (``TPU_AGENT_HOOKS``, comma-separated ``module:function``) run after activation and before user
code; a hook may return a callable, which runs when the user code ends, however it ends. Processes the user
code starts (spawned workers, ``python`` children, its own ``torch.distributed.run``) get the device when they
import torch, through torch's device-backend autoload (:mod:`.autoload`), as on a TorchTPU host.
"""

from __future__ import annotations

import atexit
import builtins
import importlib
import importlib.util
import io
import os
import runpy
import signal
import sys
import time
import traceback
import types
import zipfile
from collections.abc import Callable
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import TracebackType

from tpu_agent.errors import TpuAgentError
from tpu_agent.runtime.envvars import BACKEND_ENV, HOOKS_ENV
from tpu_agent.runtime.launcher import check_target, die_with_parent, module_not_found

Finalizer = Callable[[], object]

_OWN_FILES = {os.path.realpath(__file__), os.path.realpath(runpy.__file__), "<frozen runpy>"}


def parse_hooks(spec: str) -> list[tuple[str, str]]:
    """``"a.b:f, c:g"`` -> ``[("a.b", "f"), ("c", "g")]``; a malformed entry is a usage error."""
    hooks = []
    for entry in (part.strip() for part in spec.split(",")):
        if not entry:
            continue
        module, sep, function = entry.partition(":")
        if not sep or not module or not function:
            raise TpuAgentError(
                code="bad-hook",
                message=f"{HOOKS_ENV} entry {entry!r} is not of the form module:function",
                hint="separate entries with commas, e.g. TPU_AGENT_HOOKS=mypkg.hooks:setup",
            )
        hooks.append((module, function))
    return hooks


def run_hooks(spec: str) -> list[Finalizer]:
    """Import and call each hook; return the callables they handed back, in call order."""
    finalizers: list[Finalizer] = []
    for module_name, function_name in parse_hooks(spec):
        try:
            function = getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError) as error:
            raise TpuAgentError(
                code="bad-hook",
                message=f"cannot load hook {module_name}:{function_name} from {HOOKS_ENV}: {error}",
                hint="check that the module is importable in the ranks (PYTHONPATH) and defines the function",
            ) from error
        result = function()
        if callable(result):
            finalizers.append(result)
    return finalizers


def run_finalizers(finalizers: list[Finalizer]) -> None:
    """Last registered runs first (like atexit); one failing does not stop the others."""
    for finalizer in reversed(finalizers):
        try:
            finalizer()
        except Exception:  # noqa: BLE001 - a broken hook must not hide the user's own result
            sys.stderr.write("tpu-agent: a TPU_AGENT_HOOKS exit callable raised:\n")
            traceback.print_exc()


def _is_own_frame(filename: str) -> bool:
    return filename in _OWN_FILES or os.path.realpath(filename) in _OWN_FILES


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """Drop the leading frames of this module and runpy, so the traceback starts in user code."""
    while tb is not None and _is_own_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _prepare(argv: list[str]) -> tuple[str, bool, list[str]]:
    """Split the bootstrap's argv into (target, is_module, script args) and check the target exists."""
    from tpu_agent.runtime.options import LaunchTarget

    if not argv or argv == ["-m"]:
        raise TpuAgentError("no-target", "no script or module to run", "usage: tpu-agent run SCRIPT [ARGS...]")
    is_module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if is_module else (argv[0], argv[1:])
    check_target(LaunchTarget(target, args, is_module), Path.cwd())
    if is_module:
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise module_not_found(target)
    return target, is_module, args


def _fresh_main() -> types.ModuleType:
    """A new, empty ``__main__`` that stays in sys.modules after the code ends, as the interpreter's does.

    runpy's public functions restore the previous ``__main__`` when the code returns, which would break
    pickling of ``__main__`` classes in atexit handlers; and this module is itself ``__main__`` now.
    """
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main


def _run_user_code(target: str, is_module: bool) -> None:
    """Run the target in a fresh ``__main__`` (``sys.argv`` is already the script's)."""
    if is_module:
        _fresh_main()
        runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]  # private, but what `python -m` itself calls
        return
    if os.path.isdir(target) or zipfile.is_zipfile(target):
        sys.path.pop(0)  # run_path puts the directory itself first, as `python DIR` does
        runpy.run_path(target, run_name="__main__")
        return
    path = os.path.abspath(target)  # __file__ is absolute (python >= 3.9); argv[0] stays as typed
    sys.path[0] = os.path.dirname(os.path.realpath(target))
    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    main = _fresh_main()
    main.__dict__.update(
        __file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path), __spec__=None, __package__=None
    )
    exec(code, main.__dict__)


def _record_failure(exit_code: int, error: str) -> None:
    from tpu_agent.runtime.elastic import write_exit_record

    error = error.splitlines()[0] if error else error
    error = error if len(error) <= 200 else error[:197] + "..."
    write_exit_record(int(os.environ.get("RANK", "0")), exit_code, error, time.time_ns())


def _exit_status(code: object) -> int:
    """What Python's top level makes of ``sys.exit(code)``."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def main(argv: list[str]) -> None:
    die_with_parent(signal.SIGKILL)  # nobody supervises or reads a rank whose launcher (or agent) is gone
    try:
        target, is_module, args = _prepare(argv)
        sys.argv = [target, *args]  # before activation, so the run's RunInfo record shows the user's argv
        if os.environ.get(BACKEND_ENV) == "emulated" and "LOCAL_RANK" in os.environ:
            os.environ.setdefault("TPU_VISIBLE_DEVICES", os.environ["LOCAL_RANK"])
        from tpu_agent.runtime.api import activate

        activate()
        finalizers = run_hooks(os.environ.get(HOOKS_ENV, ""))
    except TpuAgentError as error:
        sys.stderr.write(f"tpu-agent: error: {error.message}\n")
        if error.hint:
            sys.stderr.write(f"  hint: {error.hint}\n")
        _record_failure(int(error.exit_code), error.message)
        sys.exit(int(error.exit_code))

    try:
        _run_user_code(target, is_module)
    except SystemExit as exit_request:
        status = _exit_status(exit_request.code)
        if status:
            _record_failure(status, f"sys.exit({exit_request.code!r})")
        run_finalizers(finalizers)
        raise
    except BaseException as error:  # noqa: BLE001 - reported exactly as the interpreter would
        _record_failure(1, f"{type(error).__name__}: {error}")
        trimmed = _user_traceback(error.__traceback__)
        sys.excepthook(type(error), error.with_traceback(trimmed), trimmed)
        run_finalizers(finalizers)
        if isinstance(error, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            atexit._run_exitfuncs()  # the interpreter runs them before it re-raises SIGINT on itself
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)
    run_finalizers(finalizers)


if __name__ == "__main__":
    main(sys.argv[1:])
