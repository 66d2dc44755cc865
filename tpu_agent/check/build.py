"""Building the model and its example inputs on CPU from a :class:`ModelSpec` (runs inside a check worker).

Every builder seeds torch first, so the same spec builds the same weights in every worker. A model
directory's weights are loaded only from safetensors, or from torch ``.bin`` files with ``weights_only=True``
(no pickled code runs), never with ``trust_remote_code``; before any weights are allocated the model is built
on the meta device and refused when it is larger than ``max_parameters``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_agent.check.execute import as_invocation
from tpu_agent.check.model import ModelInfo
from tpu_agent.check.spec import (
    DIRECTORY,
    FACTORY,
    FACTORY_HINT,
    HF_TYPE,
    WEIGHT_FILES,
    WEIGHT_INDEXES,
    ModelSpec,
)
from tpu_agent.errors import TpuAgentError

SEED = 0


@dataclass
class Built:
    """A model in eval mode (dropout off, so both devices compute the same function) and its inputs.

    ``rebuild`` builds the model once more the same way (seeded, in eval mode): a device run needs a model of its
    own, and only a second construction gives one whose functions (a lambda closing over submodules) call its own
    submodules, which ``copy.deepcopy`` does not."""

    model: Any
    invocation: tuple[tuple[Any, ...], dict[str, Any]]  # (args, kwargs) of the forward call
    info: ModelInfo
    rebuild: Callable[[], Any]


def _hf_class(model_type: str, task: str) -> Any:
    import transformers

    from tpu_agent.check.tiny import model_class_name

    name = model_class_name(model_type, task)
    cls = getattr(transformers, name or "", None)
    if cls is None:
        raise TpuAgentError("no-model-class", f"transformers has no class {name!r} for {model_type} / {task}", "")
    return cls


@dataclass(frozen=True)
class MetaSize:
    """What a config builds, found on the meta device (no memory allocated): its parameter count and its
    longest module list (the depth, wherever the config keeps it)."""

    parameters: int
    longest_list: int
    longest_list_name: str


def _size_on_meta(cls: Any, config: Any) -> MetaSize:
    import torch

    with torch.device("meta"):
        model = cls(config)
    lists = [(len(module), name) for name, module in model.named_modules() if isinstance(module, torch.nn.ModuleList)]
    length, name = max(lists, default=(0, ""))
    return MetaSize(sum(parameter.numel() for parameter in model.parameters()), length, name)


def _part_for(cls: Any, config: Any) -> Any:
    """The config ``cls`` takes: ``config`` itself, or the part of a composite config of the class's own config type
    (Qwen3.5's, Llama 4's and Musicgen's causal LMs take the text or decoder part of their model type's config)."""
    wanted = getattr(cls, "config_class", None)
    if not isinstance(wanted, type) or isinstance(config, wanted):
        return config
    return next((part for part in vars(config).values() if isinstance(part, wanted)), config)


def _finish(model: Any, inputs: Any, info: ModelInfo, make: Callable[[], Any]) -> Built:
    """``model``, which ``make()`` built, with its inputs; ``make`` seeds torch first, so that calling it again
    builds the same model."""
    model.eval()
    info.parameters = sum(parameter.numel() for parameter in model.parameters())
    return Built(model, as_invocation(inputs), info, lambda: make().eval())


def _build_hf_type(spec: ModelSpec) -> Built:
    import torch
    from transformers import AutoConfig

    from tpu_agent.check.tiny import TINY_MAX_LAYER_LIST, TINY_MAX_PARAMETERS, example_inputs, shrink_config

    task = spec.task or ""
    cls = _hf_class(spec.target, task)

    def tiny_config(every_kind: bool) -> Any:
        return _part_for(cls, shrink_config(AutoConfig.for_model(spec.target), every_kind=every_kind))

    config = tiny_config(every_kind=True)
    try:
        size = _size_on_meta(cls, config)
    except Exception:  # a model that refuses one layer of each kind: its first layers as they come, as before
        config = tiny_config(every_kind=False)
        size = _size_on_meta(cls, config)
    own_config = "check a model directory holding a small config.json of your own, or a module:factory"
    if size.parameters > TINY_MAX_PARAMETERS:
        raise TpuAgentError(
            "tiny-config-too-large",
            f"the tiny config derived for {spec.target!r} still describes {size.parameters:,} parameters (over "
            f"{TINY_MAX_PARAMETERS:,}): a size attribute of {type(config).__name__} has no shrink rule",
            own_config,
        )
    if size.longest_list > TINY_MAX_LAYER_LIST:
        raise TpuAgentError(
            "tiny-config-too-deep",
            f"the tiny config derived for {spec.target!r} still builds {size.longest_list} modules in "
            f"{size.longest_list_name} (over {TINY_MAX_LAYER_LIST}): a depth attribute of {type(config).__name__} "
            "has no shrink rule",
            own_config,
        )

    def make() -> Any:
        torch.manual_seed(SEED)
        return cls(config)

    model = make()
    info = ModelInfo(spec=spec.target, kind=HF_TYPE, name=cls.__name__, task=task, weights="random init, tiny config")
    return _finish(model, example_inputs(model, config, task), info, make)


def _build_directory(spec: ModelSpec, max_parameters: int) -> Built:
    import torch
    from transformers import AutoConfig

    from tpu_agent.check.tiny import example_inputs

    directory = Path(spec.target)
    task = spec.task or ""
    config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    cls = _hf_class(config.model_type, task)
    count = _size_on_meta(cls, config).parameters
    if count > max_parameters:
        raise TpuAgentError(
            "model-too-large",
            f"{directory / 'config.json'} describes a model of {count:,} parameters, over the {max_parameters:,} limit",
            "check runs the model on CPU several times; raise --max-params if this machine can hold it",
        )
    weights = [name for name in (*WEIGHT_FILES, *WEIGHT_INDEXES) if (directory / name).is_file()]

    def make() -> Any:
        torch.manual_seed(SEED)
        if not weights:
            return cls(config)
        return cls.from_pretrained(
            directory,
            local_files_only=True,
            trust_remote_code=False,
            weights_only=True,
            use_safetensors=any("safetensors" in name for name in weights) or None,
        )

    model = make()
    source = f"weights from {weights[0]}" if weights else "random init (no weights in the directory)"
    info = ModelInfo(spec=str(directory), kind=DIRECTORY, name=cls.__name__, task=task, weights=source)
    return _finish(model, example_inputs(model, config, task), info, make)


def _load_factory(target: str) -> Any:
    module_name, _, function_name = target.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            module_spec = importlib.util.spec_from_file_location(f"_tpu_agent_check_factory_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module  # torch.compile re-imports autograd.Functions by module name
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")  # like python -m: the working directory's packages are importable
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise TpuAgentError(
            "bad-factory", f"cannot import {module_name!r} for MODEL {target!r}: {error}", FACTORY_HINT
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TpuAgentError(
            "bad-factory", f"{module_name!r} has no function {function_name!r} (MODEL {target!r})", FACTORY_HINT
        )
    return function


def _build_factory(spec: ModelSpec) -> Built:
    import torch

    function = _load_factory(spec.target)

    def make() -> Any:
        torch.manual_seed(SEED)
        return function()

    result = make()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise TpuAgentError(
            "bad-factory",
            f"{spec.target} returned {type(result).__name__}, not a (torch.nn.Module, inputs) pair",
            FACTORY_HINT,
        )
    model, inputs = result
    if not isinstance(inputs, (torch.Tensor, tuple, list, dict)):
        raise TpuAgentError(
            "bad-factory", f"{spec.target} returned inputs of type {type(inputs).__name__}", FACTORY_HINT
        )
    info = ModelInfo(spec=spec.target, kind=FACTORY, name=type(model).__name__, weights="as the factory built it")
    return _finish(model, inputs, info, lambda: make()[0])


def build(spec: ModelSpec, max_parameters: int) -> Built:
    """Build the model and inputs that ``spec`` names, on CPU, seeded."""
    if spec.kind == HF_TYPE:
        return _build_hf_type(spec)
    if spec.kind == DIRECTORY:
        return _build_directory(spec, max_parameters)
    if spec.kind == FACTORY:
        return _build_factory(spec)
    raise TpuAgentError("unknown-model", f"unknown model spec kind {spec.kind!r}", "")


__all__ = ["Built", "build"]
