"""The script's own command-line switches: values read from the run's arguments, flags from its argparse calls.

A fix that says "run with --compile=True" is only right for a script that takes ``--compile=True``. nanoGPT's
configurator does; an argparse script with ``parser.add_argument("--no-compile", action="store_true")`` rejects
it, and its switch is turned by leaving the flag out. So the advice comes from how the script declares the
switch (:func:`argparse_flag`), and only a switch it does not declare as a flag gets ``--name=value``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tpu_agent.profile.sources import dotted_name, parse_source

# argparse actions that set a switch without taking a value, by the name the script uses for them
_FLAG_ACTIONS = {"store_true": "store_true", "store_false": "store_false", "BooleanOptionalAction": "optional"}


def command_line_value(args: list[str], name: str) -> str | None:
    """The value ``--name=value`` (or ``--name value``) gives on the script's command line, the last one wins."""
    value = None
    for index, arg in enumerate(args):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and index + 1 < len(args):
            value = args[index + 1]
    return value


@dataclass(frozen=True)
class CommandLineFlag:
    """An argparse option that sets a switch by its presence: ``--no-compile`` (``store_true`` into
    ``no_compile``), ``--eager`` (``store_false``), ``--compile`` with ``BooleanOptionalAction`` (which also
    takes ``--no-compile``)."""

    option: str  # the long option as declared: "--no-compile"
    action: str  # "store_true", "store_false" or "optional" (BooleanOptionalAction)
    line: int

    def option_for(self, value: bool) -> str | None:
        """The option that sets the switch to ``value``; None: leaving the flag out does."""
        if self.action == "optional":
            return self.option if value else "--no-" + self.option.removeprefix("--")
        return self.option if value == (self.action == "store_true") else None

    def advice(self, value: bool, args: list[str]) -> str:
        """How to run the script so that the switch is ``value``, given this run's arguments ``args``."""
        wanted = self.option_for(value)
        given = [a for a in (self.option_for(True), self.option_for(False)) if a is not None and a in args]
        if wanted is None:
            return f"run without {self.option}" + (" (this run passed it)" if self.option in given else "")
        passed = [a for a in given if a != wanted]
        return f"run with {wanted}" + (f" instead of {passed[0]}" if passed else "")


def argparse_flag(path: str, dest: str) -> CommandLineFlag | None:
    """The argparse flag of ``path`` that stores into ``dest`` (``args.no_compile`` -> ``--no-compile``), if the
    script declares ``dest`` as a flag (an option that takes a value is not one)."""
    tree = parse_source(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        longs = [o for o in options if o.startswith("--")]
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        named = keywords.get("dest")
        declared = named.value if isinstance(named, ast.Constant) else longs[0][2:].replace("-", "_") if longs else None
        if declared != dest or not longs:
            continue
        action = keywords.get("action")
        name = action.value if isinstance(action, ast.Constant) else dotted_name(action) if action else None
        kind = _FLAG_ACTIONS.get(str(name).rsplit(".", 1)[-1]) if name else None
        return CommandLineFlag(longs[0], kind, node.lineno) if kind else None
    return None
