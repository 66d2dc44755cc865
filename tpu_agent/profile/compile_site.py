"""Where the model is built and where the script already compiles it, read from the syntax tree (EM-3).

When nothing was compiled, the fix depends on the script. nanoGPT already has ``if compile: model =
torch.compile(model)``, switched off by ``--compile=False``: the advice is the flag, not a second compile.
Without such a call, ``model = torch.compile(model, backend="tpu")`` goes after the model is built, at the
level that always runs (see :mod:`placement`): after the last statement that rebinds the model on every path
or moves it (``model.to(device)``), never inside ``if ddp:`` or one branch of ``if init_from == ...``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tpu_agent.profile import patches, placement
from tpu_agent.profile.sources import dotted_name, function_at, own_nodes, parse_source, read_source, scope_of
from tpu_agent.runtime.compile_options import OPTION_KEYS

COMPILE_CALLS = frozenset({"torch.compile"})
TPU_BACKEND = "tpu"


@dataclass(frozen=True)
class CompileCall:
    """A ``torch.compile(...)`` of the model already in the script, and the ``if`` that decides whether it runs."""

    line: int
    call: str  # as written
    backend: str | None  # the backend= argument as written; None: TorchTPU picks "tpu" for TPU inputs
    refused: tuple[str, ...]  # keyword arguments TorchTPU's backend refuses, as written (mode=..., dynamic=True)
    condition: str | None  # the test of the innermost ``if`` around it, as written
    runs_when: bool  # the value that test needs for the call to run (False: it sits in the ``else``)
    switch: str | None  # the name the test reads (``compile``, ``args.compile`` -> ``compile``)


@dataclass(frozen=True)
class Construction:
    """The statement that builds the model (``model = GPT(config)``) and the name it binds."""

    line: int
    variable: str


def _builds(value: ast.AST, class_name: str) -> bool:
    """Whether ``value`` calls ``ClassName(...)``, ``module.ClassName(...)`` or ``ClassName.from_pretrained(...)``."""
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            parts = (dotted_name(node.func) or "").split(".")
            if parts[-1] == class_name or (len(parts) > 1 and parts[-2] == class_name):
                return True
    return False


def _is_construction(node: ast.Assign, class_name: str) -> bool:
    return len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and _builds(node.value, class_name)


def model_construction(path: str, class_name: str, before_line: int) -> Construction | None:
    """The ``model = ClassName(...)`` that feeds the step at ``before_line``: the latest one before it in the same
    function, else the first one anywhere in the file (the model built in ``main`` and stepped in ``train``)."""
    tree = parse_source(path)
    if tree is None:
        return None
    nearby = [
        n
        for n in own_nodes(scope_of(tree, before_line))
        if isinstance(n, ast.Assign) and _is_construction(n, class_name)
    ]
    before = sorted((n for n in nearby if n.lineno < before_line), key=lambda n: n.lineno)
    assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    anywhere = sorted((n for n in assigns if _is_construction(n, class_name)), key=lambda n: n.lineno)
    found = before[-1] if before else anywhere[0] if anywhere else None
    if found is None or not isinstance(found.targets[0], ast.Name):
        return None
    return Construction(found.lineno, found.targets[0].id)


def _use_line(path: str, scope: ast.AST, variable: str, built: int, step_line: int) -> int | None:
    """The line where the model reaches the step: the step itself when in the same function as the construction,
    else the call that passes the model to the function holding the step (``train(model, ...)``)."""
    tree = parse_source(path)
    if tree is None or scope_of(tree, step_line) is scope:
        return step_line
    function = function_at(path, step_line)
    for node in sorted((n for n in own_nodes(scope) if isinstance(n, ast.Call)), key=lambda n: n.lineno):
        passed = [*node.args, *(k.value for k in node.keywords)]
        passes = any(isinstance(a, ast.Name) and a.id == variable for a in passed)
        if node.lineno > built and passes and (dotted_name(node.func) or "").split(".")[-1] == function:
            return node.lineno
    return None


def wrap_model_after_construction(
    path: str, class_name: str, before_line: int, wrapper: str, built: Construction | None = None
) -> str | None:
    """Add ``model = <wrapper>`` (``wrapper`` formats ``{var}``) after the model is built and moved, at the level
    that runs on every path to the step at ``before_line``; ``None`` when no construction is found. ``built``:
    the :func:`model_construction` the caller already found, if it looked."""
    tree = parse_source(path)
    if built is None:
        built = model_construction(path, class_name, before_line)
    if tree is None or built is None:
        return None
    variable = built.variable
    scope = scope_of(tree, built.line)
    use = _use_line(path, scope, variable, built.line, before_line)
    body = getattr(scope, "body", None)
    shared = placement.common_level(body, built.line, use) if isinstance(body, list) and use else None
    if shared is None or shared[1] >= shared[2]:
        return None
    statements, first, stop = shared
    last = max(
        index
        for index in range(first, stop)
        if index == first
        or placement.rebinds_on_every_path([statements[index]], variable)
        or placement.calls_method_of(statements[index], variable)
    )
    anchor = statements[last]
    statement = f"{variable} = {wrapper.format(var=variable)}"
    return patches.insert_after_block(path, anchor.lineno, anchor.end_lineno or anchor.lineno, statement)


def _foreign_options(value: ast.expr) -> bool:
    """Whether ``options=`` is a dict literal of another backend's options only (Inductor's ``{"max_autotune":
    True}``): TorchTPU raises on unknown keys. A dict that also holds TorchTPU's own keys is left alone (the
    runtime's error names the others)."""
    if not isinstance(value, ast.Dict) or not value.keys:
        return False
    keys = [k.value if isinstance(k, ast.Constant) else None for k in value.keys]
    return all(isinstance(k, str) and k not in OPTION_KEYS for k in keys)


def _refused(call: ast.Call, source: str) -> tuple[str, ...]:
    """Keywords TorchTPU's backend refuses: Inductor's ``mode=`` and ``options=``, ``dynamic=True``, a backend
    other than tpu."""
    refused = []
    for keyword in call.keywords:
        value = keyword.value
        constant = value.value if isinstance(value, ast.Constant) else None
        if (
            keyword.arg == "mode"
            or (keyword.arg == "dynamic" and constant is True)
            or (keyword.arg == "backend" and isinstance(constant, str) and constant != TPU_BACKEND)
            or (keyword.arg == "options" and _foreign_options(value))
        ):
            refused.append(ast.get_source_segment(source, keyword) or keyword.arg or "")
    return tuple(refused)


def _innermost_if(body: list[ast.stmt], line: int) -> tuple[ast.If, bool] | None:
    """The innermost ``if`` whose branch holds ``line``, and whether that branch is its body (not the else)."""
    found = None
    levels = placement.chain(body, line)
    for (stmts, index), (inner, _) in zip(levels, levels[1:], strict=False):
        statement = stmts[index]
        if isinstance(statement, ast.If):
            found = (statement, inner is statement.body)
    return found


def _switch(test: ast.expr) -> tuple[str, bool] | None:
    """``compile`` / ``args.compile`` / ``not compile``: the switch's name and whether the test is it (not its
    negation)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _switch(test.operand)
        return (inner[0], not inner[1]) if inner else None
    if isinstance(test, ast.Name):
        return test.id, True
    if isinstance(test, ast.Attribute):
        return test.attr, True
    return None


def existing_compile(path: str, variables: set[str]) -> CompileCall | None:
    """The first ``torch.compile(x, ...)`` of one of ``variables`` (any name when empty) in the file."""
    tree, text = parse_source(path), read_source(path)
    if tree is None or text is None:
        return None
    calls = sorted(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and dotted_name(n.func) in COMPILE_CALLS
            and n.args
            and isinstance(n.args[0], ast.Name)
            and (not variables or n.args[0].id in variables)
        ),
        key=lambda n: n.lineno,
    )
    if not calls:
        return None
    call = calls[0]
    backend = next((k.value for k in call.keywords if k.arg == "backend"), None)
    scope = scope_of(tree, call.lineno)
    around = _innermost_if(getattr(scope, "body", []), call.lineno)
    condition, runs_when, switch = None, True, None
    if around is not None:
        statement, in_body = around
        condition = ast.get_source_segment(text, statement.test)
        named = _switch(statement.test)
        runs_when = in_body if named is None else in_body == named[1]
        switch = named[0] if named else None
    return CompileCall(
        line=call.lineno,
        call=ast.get_source_segment(text, call) or "torch.compile(...)",
        backend=ast.get_source_segment(text, backend) if backend is not None else None,
        refused=_refused(call, text),
        condition=condition,
        runs_when=runs_when,
        switch=switch,
    )


def drop_refused(path: str, call: CompileCall) -> str | None:
    """The diff that removes the keywords TorchTPU refuses from that call (a plain ``torch.compile(model)`` then
    picks the tpu backend for TPU inputs)."""
    names = {text.split("=", 1)[0].strip() for text in call.refused}
    return patches.drop_call_kwargs(path, call.line, "torch.compile", names) if names else None


def config_file_setting(script: str, args: list[str], name: str) -> tuple[str, int, str] | None:
    """A config file on the script's command line (nanoGPT's ``config/tiny.py``) that assigns ``name``: its
    path, line and value as written, the last one that does."""
    found = None
    for arg in args:
        if arg.startswith("-") or not arg.endswith(".py"):
            continue
        for candidate in (Path(arg), Path(script).parent / arg):
            tree, text = parse_source(str(candidate)), read_source(str(candidate))
            if tree is None or text is None:
                continue
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(placement.binds(t, name) for t in node.targets):
                    found = (
                        patches.display_path(str(candidate)),
                        node.lineno,
                        ast.get_source_segment(text, node.value) or "",
                    )
            break
    return found
