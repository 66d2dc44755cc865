"""What a rule handler sees of the file being migrated: names, targets, reporting and code builders.

One :class:`PyContext` lives for one libcst pass over one Python file (or one notebook's code cells). It
resolves qualified names from the file's imports (``import torch.cuda as tc`` makes ``tc.synchronize`` read
as ``torch.cuda.synchronize``), records findings against original nodes (positions are computed once, after
the pass, only when there are findings) and hands out the replacement expressions for the chosen target, so
every rule writes the same device resolver and the same ``torch`` alias.

Why this module is long: name resolution, reporting (with the roll-back of one handler's findings, TODOs and
resolver needs when it raises) and the code builders all read and write the one :class:`PyContext` state that a
rule handler is handed; split, each part would reach into another module's dataclass fields.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import libcst as cst

from tpu_agent.migrate.analysis.astnodes import nodes
from tpu_agent.migrate.analysis.bindings import Bindings, mentions_name
from tpu_agent.migrate.analysis.bindings import analyse as analyse_bindings
from tpu_agent.migrate.analysis.crossmodule import ImportedFlow
from tpu_agent.migrate.analysis.local_names import bound_anywhere, local_names
from tpu_agent.migrate.analysis.unpacked import Unpacked
from tpu_agent.migrate.analysis.unpacked import analyse as analyse_unpacked
from tpu_agent.migrate.analysis.valueflow import ValueFlow
from tpu_agent.migrate.analysis.valueflow import analyse as analyse_value_flow
from tpu_agent.migrate.cstnodes import dotted, string_like
from tpu_agent.migrate.model import FileKind, MigrateOptions, Rule, Safety, Target

T = TypeVar("T")
# what the tree's modules importing this one do with its constants, by analysis key (``name:ACCEL``)
Imported = Mapping[str, tuple[ImportedFlow, ...]]

RESOLVER_RE = re.compile(
    r"^(?P<name>[A-Za-z_]\w*) = (?P<torch>[A-Za-z_]\w*)\.accelerator\.current_accelerator\(check_available=True\)"
    r" or (?P=torch)\.device\([\"']cpu[\"']\)[ \t]*\r?$",
    re.MULTILINE,
)
RESOLVER_SINCE_TORCH = "2.7"  # torch.accelerator.current_accelerator(check_available=True)
RESOLVER_COMMENT = "# tpu-agent: the accelerator in use (TPU, CUDA, ...) or the CPU when there is none"
_TENSORISH_BASE_RE = re.compile(r"(Module|Tensor|Parameter|Sequential|ModuleList|ModuleDict)$")


@dataclass
class PendingFinding:
    code: str
    node: cst.CSTNode
    message: str
    safety: Safety
    fixed: bool
    top: int = -1  # index of the top-level statement it is in


# A context's reporting state before a handler runs (:meth:`PyContext.mark`): how many findings and TODOs there
# were, and the needs (resolver, ``import torch``, the first statement using the resolver). A plain tuple: the pass
# takes one before every handler call, a third of a million per hundred thousand lines, and a named tuple's
# constructor cost a few per cent of the run.
Mark = tuple[int, int, bool, bool, int | None]


@dataclass
class UserCudaClasses:
    """Classes of this file that define their own ``cuda()`` and are not tensors or modules.

    ``obj.cuda()`` on such an object is the user's method, not ``Tensor.cuda``; it must stay.
    """

    classes: frozenset[str] = frozenset()
    instances: frozenset[str] = frozenset()

    @classmethod
    def scan(cls, source: str) -> UserCudaClasses:
        """A quick stdlib ``ast`` scan, run only for files that contain ``def cuda``."""
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return cls()
        classes = set()
        for node in nodes(tree):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "cuda" for item in node.body
            ):
                bases = [ast.unparse(base) for base in node.bases]
                if not any(_TENSORISH_BASE_RE.search(base) for base in bases):
                    classes.add(node.name)
        instances: set[str] = set()
        for node in nodes(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if name in classes:
                    instances.update(t.id for t in node.targets if isinstance(t, ast.Name))
        return cls(frozenset(classes), frozenset(instances))


@dataclass
class PyContext:
    options: MigrateOptions
    rules: Mapping[str, Rule]
    device_name: str = "DEVICE"
    resolver_exists: bool = False
    torch_name: str = "torch"
    user_cuda: UserCudaClasses = field(default_factory=UserCudaClasses)
    # qualified names of calls some family rewrites as a whole (Family.claim): the generic rules skip them
    claimed_calls: frozenset[str] = frozenset()

    aliases: dict[str, str] = field(default_factory=dict)
    imports_cuda_module: bool = False  # some ``import torch.cuda`` (without ``as``) binds ``torch`` too
    findings: list[PendingFinding] = field(default_factory=list)
    needs_torch: bool = False
    needs_device: bool = False
    device_first_top: int | None = None
    top_index: int = -1
    stmt_stack: list[cst.CSTNode] = field(default_factory=list)
    # the module's top-level statements (``top_index`` is the current one's position) and the ids of the
    # statements the gate marked inert (not visited); in a ``reduced`` module the inert top-level ones are stubs
    # standing for the code, and a rule that needs to read one sets ``needs_full_parse``
    module_body: Sequence[cst.BaseStatement] = ()
    inert_statements: set[int] = field(default_factory=set)
    reduced: bool = False
    needs_full_parse: bool = False
    class_stack: list[str] = field(default_factory=list)
    todos: dict[int, list[str]] = field(default_factory=dict)
    _todo_log: list[int] = field(default_factory=list)  # the statement of each TODO added, in order (roll-backs)
    # ids of original nodes, filled on the way down and read on the way up
    call_funcs: set[int] = field(default_factory=set)
    not_references: set[int] = field(default_factory=set)
    # assignment targets (``self.is_cuda = ...``): an expression rewritten there would not be assignable
    targets: set[int] = field(default_factory=set)
    claimed: set[int] = field(default_factory=set)
    bare_positions: set[int] = field(default_factory=set)
    # ids of the operands of ``and``/``or``/``not``: bare for a comparison, but an ``or`` there needs parentheses
    operands: set[int] = field(default_factory=set)
    # names assigned an accelerator-availability check (``use_cuda = torch.cuda.is_available()``): an ``if``
    # on them guards accelerator calls as well as the check itself
    available_names: set[str] = field(default_factory=set)
    # ids of the original ``if`` statements the pass is in the ``else``/``elif`` branch of: they guard nothing there
    in_orelse: set[int] = field(default_factory=set)
    # id of an original ``if`` -> a condition a rule ANDs into its test on the way up, with a comment
    extra_tests: dict[int, tuple[cst.BaseExpression, str]] = field(default_factory=dict)
    # statement lines (by the id of the original) a rule keeps for CUDA runs behind a not-TPU guard (TPU709)
    cuda_only_lines: set[int] = field(default_factory=set)
    # the CPU-fallback expressions the rules built (by id), dropped again inside an enclosing check
    cpu_fallbacks: dict[int, cst.CSTNode] = field(default_factory=dict)
    _qualnames: dict[int, str | None] = field(default_factory=dict)
    _local_names: dict[int, frozenset[str]] = field(default_factory=dict)  # by the id of a FunctionDef
    _bound_anywhere: frozenset[str] | None = None  # every name the module binds, in any scope (_shadowed)
    fstring_quotes: list[str] = field(default_factory=list)  # quotes of the f-strings the pass is inside
    _device_uses: int = 0  # how many replacements referred to the resolver (DEVICE) so far
    source: str = ""  # the file's text, for the analyses computed on demand
    _mentions: dict[str, bool] = field(default_factory=dict)
    _value_flow: ValueFlow | None = None
    _bindings: Bindings | None = None
    _unpacked: dict[str, Unpacked] = field(default_factory=dict)
    ast_tree: ast.Module | None = None  # the stdlib parse of ``source`` when the engine has one
    imported_flows: Imported = field(default_factory=dict)
    current_code: str | None = None  # the rule the running handler last reported or fixed under (internal errors)

    @classmethod
    def for_source(
        cls,
        source: str,
        options: MigrateOptions,
        rules: Mapping[str, Rule],
        claimed_calls: frozenset[str] = frozenset(),
        tree: ast.Module | None = None,
    ) -> PyContext:
        """Decide the resolver name and the ``torch`` alias from the module's statements (``tree``, the stdlib
        parse of ``source``), before the pass needs them. Without a tree the choices are the safe ones: a
        resolver of another name wherever the text mentions ``DEVICE``, and ``torch`` imported as ``torch``."""
        ctx = cls(options=options, rules=rules, claimed_calls=claimed_calls, source=source, ast_tree=tree)
        resolver = _existing_resolver(source, tree)
        if resolver is not None:
            ctx.device_name, ctx.resolver_exists = resolver, True
        elif ctx.device_name in source and (tree is None or mentions_name(tree, ctx.device_name)):
            ctx.device_name = "TPU_AGENT_DEVICE"  # the user's code binds or reads DEVICE (in any scope)
        if tree is not None:
            ctx.torch_name = _torch_alias(tree)
        if "def cuda" in source:
            ctx.user_cuda = UserCudaClasses.scan(source)
        return ctx

    def mentions(self, text: str) -> bool:
        """Whether the file's text holds ``text`` anywhere. Rules ask it at every node of a kind (is there any
        ``get_device_properties`` to read a field of?); searching the whole text each time cost a tenth of the run
        on long files, so each text is searched once."""
        found = self._mentions.get(text)
        if found is None:
            found = self._mentions[text] = text in self.source
        return found

    @property
    def value_flow(self) -> ValueFlow:
        """Where the module's names and attributes are used (computed on first need: most files never ask)."""
        if self._value_flow is None:
            self._value_flow = analyse_value_flow(self.source, self.ast_tree)
        return self._value_flow

    @property
    def bindings(self) -> Bindings:
        """What the module binds to each name and attribute (computed on first need; empty without a tree)."""
        if self._bindings is None:
            self._bindings = analyse_bindings(self.ast_tree) if self.ast_tree is not None else Bindings()
        return self._bindings

    def unpacked(self, function: str) -> Unpacked:
        """The mappings the module unpacks with ``**`` into calls of ``function``, and whether it shows every
        entry each holds (:mod:`~tpu_agent.migrate.analysis.unpacked`; nothing without a tree)."""
        if function not in self._unpacked:
            tree = self.ast_tree
            self._unpacked[function] = analyse_unpacked(tree, function) if tree is not None else Unpacked()
        return self._unpacked[function]

    @property
    def scope_path(self) -> tuple[str, ...]:
        """The names of the ``def``/``class`` statements around the current statement (as
        :mod:`~tpu_agent.migrate.analysis.unpacked` names scopes)."""
        return tuple(s.name.value for s in self.stmt_stack if isinstance(s, (cst.FunctionDef, cst.ClassDef)))

    # ---- names -------------------------------------------------------------------------------------
    @property
    def target(self) -> Target:
        return self.options.target

    def bind_import(self, node: cst.Import | cst.ImportFrom) -> None:
        """Record the names an import binds (imports inside functions too: a conservative over-approximation)."""
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _dotted_name(alias.name)
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.aliases[alias.asname.name.value] = full
                else:
                    head = full.split(".")[0]
                    self.aliases[head] = head
                    self.imports_cuda_module |= full == "torch.cuda" or full.startswith("torch.cuda.")
            return
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = _dotted_name(node.module)
        for alias in node.names:
            name = _dotted_name(alias.name)
            bound = (
                alias.asname.name.value
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
                else name
            )
            self.aliases[bound] = f"{module}.{name}"

    def qualname(self, node: cst.CSTNode) -> str | None:
        """The qualified name of a reference (``Name``/``Attribute`` chain) or of a call's function."""
        if isinstance(node, cst.Call):
            node = node.func
        key = id(node)
        if key in self._qualnames:
            return self._qualnames[key]
        parts: list[str] = []
        current = node
        while isinstance(current, cst.Attribute):
            parts.append(current.attr.value)
            current = current.value
        result = None
        if isinstance(current, cst.Name):
            base = self.aliases.get(current.value)
            if base is not None and not self._shadowed(current.value):  # scopes are read for imports' names only
                result = ".".join([base, *reversed(parts)])
        self._qualnames[key] = result
        return result

    def _shadowed(self, name: str) -> bool:
        """Whether a function around the current statement binds ``name`` itself (a parameter ``config``
        beside ``import torch._inductor.config as config``): there the name is not the import. A name the module
        binds nowhere (``torch``, ``dist`` almost always) is answered without walking the functions."""
        if self.ast_tree is not None:
            if self._bound_anywhere is None:
                self._bound_anywhere = bound_anywhere(self.ast_tree)
            if name not in self._bound_anywhere:
                return False
        for statement in self.stmt_stack:
            if isinstance(statement, cst.FunctionDef):
                names = self._local_names.get(id(statement))
                if names is None:
                    names = self._local_names[id(statement)] = local_names(statement)
                if name in names:
                    return True
        return False

    def resolve(self, dotted_name: str) -> str | None:
        """The qualified name of a dotted name as the file's imports bind it (``tc.synchronize`` after ``import
        torch.cuda as tc`` is ``torch.cuda.synchronize``), None when its head is no import."""
        head, dot, rest = dotted_name.partition(".")
        base = self.aliases.get(head)
        return None if base is None else base + dot + rest

    def is_call_func(self, node: cst.CSTNode) -> bool:
        return id(node) in self.call_funcs

    def is_target(self, node: cst.CSTNode) -> bool:
        return id(node) in self.targets

    def claim(self, node: cst.CSTNode) -> None:
        """Mark a node some handler will deal with as a whole, so that no other handler reports it."""
        self.claimed.add(id(node))

    def is_claimed(self, node: cst.CSTNode) -> bool:
        return id(node) in self.claimed

    def is_bare(self, node: cst.CSTNode) -> bool:
        """True where a comparison can replace ``node`` without parentheses (an ``if`` test, an argument...)."""
        return id(node) in self.bare_positions

    def is_operand(self, node: cst.CSTNode) -> bool:
        """True where ``node`` is an operand of ``and``/``or``/``not`` (an ``or`` replacing it needs parentheses)."""
        return id(node) in self.operands

    def is_user_cuda_receiver(self, receiver: cst.BaseExpression) -> bool:
        """True when ``receiver.cuda()`` calls a ``cuda`` method the user defined on a non-tensor class."""
        uc = self.user_cuda
        if not uc.classes:
            return False
        if isinstance(receiver, cst.Name):
            if receiver.value == "self":
                return bool(self.class_stack) and self.class_stack[-1] in uc.classes
            return receiver.value in uc.instances or receiver.value in uc.classes
        if isinstance(receiver, cst.Call):
            func = receiver.func
            name = (
                func.value
                if isinstance(func, cst.Name)
                else func.attr.value
                if isinstance(func, cst.Attribute)
                else None
            )
            return name in uc.classes
        return False

    # ---- reporting ---------------------------------------------------------------------------------
    def report(self, code: str, node: cst.CSTNode, message: str | None = None, *, fixable: bool = True) -> bool:
        """Record a finding for ``node`` (an ORIGINAL node); True when the caller should apply its fix.

        A disabled rule reports nothing and fixes nothing. MANUAL rules never fix; UNSAFE rules fix only with
        ``unsafe_fixes``; ``fixable=False`` marks an occurrence this rule cannot rewrite (the message says why).
        """
        self.current_code = code
        fixed = decide(self.options, self.rules, code, fixable)
        if fixed is None:
            return False
        rule = self.rules[code]
        text = message or rule.summary
        if fixable and not self.options.torch_allows(rule.since_torch):
            text += f" (not rewritten: needs torch >= {rule.since_torch}, --min-torch is {self.options.min_torch})"
        self.findings.append(PendingFinding(code, node, text, rule.safety_for(self.target), fixed, self.top_index))
        if not fixed:
            self._add_todo(code, text)
        return fixed

    def _add_todo(self, code: str, text: str) -> None:
        """With ``--annotate``, a TODO comment above the current statement."""
        if self.options.annotate and self.stmt_stack:
            key = id(self.stmt_stack[-1])
            self.todos.setdefault(key, []).append(todo_comment(code, text))
            self._todo_log.append(key)

    def fix(
        self,
        code: str,
        node: cst.CSTNode,
        build: Callable[[], T],
        message: Callable[[T], str],
    ) -> T | None:
        """Build a replacement, report it, and return it when it applies (None leaves the code as it is).

        Building may register needs (``import torch``, the device resolver); they are rolled back when the
        finding is not fixed, so a report-only finding never adds code to the file.
        """
        snapshot = (self.needs_device, self.needs_torch, self.device_first_top)
        uses_before = self._device_uses
        self.current_code = code
        new = build()
        # the resolver line (torch.accelerator.current_accelerator) is itself an API with a minimum torch
        if self._device_uses != uses_before and not self.options.torch_allows(RESOLVER_SINCE_TORCH):
            text = (
                f"{message(new)} (not rewritten: the device resolver needs torch >= {RESOLVER_SINCE_TORCH}, "
                f"--min-torch is {self.options.min_torch})"
            )
            self.report(code, node, text, fixable=False)
            self.needs_device, self.needs_torch, self.device_first_top = snapshot
            return None
        if self.report(code, node, message(new)):
            return new
        self.needs_device, self.needs_torch, self.device_first_top = snapshot
        return None

    def mark(self) -> Mark:
        """What a handler may change here, before it runs (:meth:`internal_error` restores it)."""
        self.current_code = None
        return len(self.findings), len(self._todo_log), self.needs_device, self.needs_torch, self.device_first_top

    def internal_error(self, mark: Mark, owner: str, node: cst.CSTNode, error: Exception) -> None:
        """A handler raised at ``node`` (an original node): forget what it reported and asked for since
        ``mark`` (its edit is dropped) and report the error under the rule it was working for (``owner``, its
        family's first rule, when it had named none), with a request to report it."""
        findings, todos, self.needs_device, self.needs_torch, self.device_first_top = mark
        del self.findings[findings:]
        while len(self._todo_log) > todos:
            self.todos[self._todo_log.pop()].pop()
        code = self.current_code or owner
        text = " ".join(str(error).split())[:200]
        message = (
            f"tpu-agent internal error in rule {code} ({type(error).__name__}: {text}): this occurrence was left as "
            "it is and the rest of the file was migrated; please report it with this line to "
            "https://github.com/tpu-agent/tpu-agent/issues"
        )
        safety = self.rules[code].safety_for(self.target)
        self.findings.append(PendingFinding(code, node, message, safety, False, self.top_index))
        self._add_todo(code, message)

    # ---- builders ----------------------------------------------------------------------------------
    def torch_attr(self, path: str) -> cst.Name | cst.Attribute:
        """``torch.<path>`` spelled with the file's own ``torch`` alias."""
        self.needs_torch = True
        return dotted(f"{self.torch_name}.{path}")

    def _use_device(self) -> cst.Name:
        self._device_uses += 1
        self.needs_device = True
        self.needs_torch = True
        if self.stmt_stack and (self.device_first_top is None or self.top_index < self.device_first_top):
            self.device_first_top = self.top_index
        return cst.Name(self.device_name)

    def device(self, template: cst.CSTNode | None = None) -> cst.BaseExpression:
        """A ``torch.device`` for the target: the module's resolver, or ``torch.device("tpu")``."""
        if self.target is Target.TPU:
            return cst.Call(func=self.torch_attr("device"), args=[cst.Arg(string_like(template, "tpu"))])
        return self._use_device()

    def device_value(self, template: cst.CSTNode | None = None) -> cst.BaseExpression:
        """What to pass where a device is accepted: the resolver, or the string ``"tpu"``."""
        if self.target is Target.TPU:
            return string_like(template, "tpu")
        return self._use_device()

    def device_type(self, template: cst.CSTNode | None = None) -> cst.BaseExpression:
        """The device type as a string: ``DEVICE.type``, or ``"tpu"``."""
        if self.target is Target.TPU:
            return string_like(template, "tpu")
        return cst.Attribute(value=self._use_device(), attr=cst.Name("type"))

    def default_backend(self, template: cst.CSTNode | None = None) -> cst.BaseExpression:
        """The process-group backend for the target's device: ``"tpu_dist"``, or the one torch maps DEVICE to."""
        if self.target is Target.TPU:
            return string_like(template, "tpu_dist")
        return cst.Call(
            func=self.torch_attr("distributed.get_default_backend_for_device"), args=[cst.Arg(self._use_device())]
        )

    def string(self, value: str) -> cst.SimpleString:
        """A new string literal that is valid where the pass is: inside a ``"``-quoted f-string (whose
        expressions cannot reuse its quote before Python 3.12) it takes single quotes."""
        quote = "'" if '"' in self.fstring_quotes else '"'
        return cst.SimpleString(f"{quote}{value}{quote}")

    def todo_comments(self, statement: cst.CSTNode) -> list[str]:
        return self.todos.get(id(statement), [])


def _existing_resolver(source: str, tree: ast.Module | None) -> str | None:
    """The name of the device resolver an earlier migration put in the module (a module-level assignment, not
    the same text in a docstring), or None."""
    for match in RESOLVER_RE.finditer(source):
        if tree is None:
            return match.group("name")
        line = source.count("\n", 0, match.start()) + 1
        for statement in tree.body:
            if (
                isinstance(statement, ast.Assign)
                and statement.lineno == line
                and [getattr(t, "id", None) for t in statement.targets] == [match.group("name")]
            ):
                return match.group("name")
    return None


def _torch_alias(tree: ast.Module) -> str:
    """The name the module's top-level ``import torch as th`` binds, unless it also imports torch plainly."""
    alias = None
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            for name in statement.names:
                if name.asname is None and name.name.partition(".")[0] == "torch":
                    return "torch"
                if name.asname is not None and name.name == "torch":
                    alias = alias or name.asname
    return alias or "torch"


def decide(options: MigrateOptions, rules: Mapping[str, Rule], code: str, fixable: bool) -> bool | None:
    """Whether a finding of rule ``code`` is fixed: None when the rule is disabled (no finding at all)."""
    if not options.rule_enabled(code):
        return None
    safety = rules[code].safety_for(options.target)
    fixable = fixable and options.torch_allows(rules[code].since_torch)
    return fixable and (safety is Safety.SAFE or (safety is Safety.UNSAFE and options.unsafe_fixes))


def todo_comment(code: str, message: str) -> str:
    """The ``--annotate`` comment text for an unfixed finding (one line)."""
    return f"# TODO(tpu-agent {code}): {' '.join(message.split())}"


def _dotted_name(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr.value}"
    raise TypeError(type(node).__name__)


@dataclass
class TextContext:
    """What a text fix sees: the options and the kind of file (shell, env, YAML, Dockerfile)."""

    options: MigrateOptions
    kind: FileKind

    @property
    def target(self) -> Target:
        return self.options.target
