"""What ``tpu-agent check MODEL`` was asked to check: a Hugging Face model type, a local model directory, or
``module:factory``; parsed and validated up front, so that a typo is a usage error (exit 2) before any process
starts, and so that every front end (CLI, MCP, benchmark) refuses the same inputs with the same words.

A model directory is untrusted input: its ``config.json`` is size-capped and must be a JSON object naming a
``model_type`` that transformers knows (code shipped in the directory, ``auto_map``, is never run), and a
sharded-weights index may only name files inside the directory.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpu_agent.check.tiny import TASK_MAPPINGS
from tpu_agent.errors import TpuAgentError

HF_TYPE, DIRECTORY, FACTORY = "hf-type", "directory", "factory"
MAX_CONFIG_BYTES = 1 << 20
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FACTORY_HINT = (
    "write MODULE:FUNCTION (e.g. mypkg.models:make_model) or path/to/file.py:FUNCTION; the function takes no "
    "arguments and returns (model, inputs), inputs being a tensor, a tuple of positional arguments or a dict"
)


@dataclass(frozen=True)
class ModelSpec:
    """A validated MODEL argument; ``target`` is the model type, the directory, or ``module:function``."""

    kind: str
    target: str
    task: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return cls(**data)


def _require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise TpuAgentError(
            "transformers-missing",
            "checking a Hugging Face model needs the transformers package, which is not installed",
            'pip install "tpu-agent[hf]"',
        ) from None
    return transformers


def known_model_types() -> list[str]:
    _require_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return sorted(CONFIG_MAPPING_NAMES)


def _check_task(task: str | None) -> None:
    if task is not None and task not in TASK_MAPPINGS:
        raise TpuAgentError(
            "unknown-task", f"unknown task {task!r} (--task)", f"use one of: {', '.join(TASK_MAPPINGS)}"
        )


def _check_task_for_type(model_type: str, task: str | None, argument: str) -> str:
    from tpu_agent.check.tiny import default_task, model_class_name

    if task is None:
        chosen = default_task(model_type)
        if chosen is None:
            raise TpuAgentError(
                "no-model-class",
                f"transformers has no model class for type {model_type!r} ({argument})",
                "pass a module:factory that builds it",
            )
        return chosen
    if model_class_name(model_type, task) is None:
        tasks = [name for name in TASK_MAPPINGS if model_class_name(model_type, name) is not None]
        raise TpuAgentError(
            "task-not-supported",
            f"model type {model_type!r} has no {task} class in transformers",
            f"use --task {' or --task '.join(tasks)}" if tasks else "pass a module:factory that builds it",
        )
    return task


def _parse_hf_type(value: str, task: str | None) -> ModelSpec:
    types = known_model_types()
    if value not in types:
        close = difflib.get_close_matches(value, types, n=3)
        raise TpuAgentError(
            "unknown-model",
            f"{value!r} is not a Hugging Face model type, a model directory, or module:factory (MODEL)",
            (f"did you mean {', '.join(close)}? " if close else "")
            + "model types are transformers' config names, e.g. llama, bert, t5, vit; a directory must exist",
        )
    return ModelSpec(HF_TYPE, value, _check_task_for_type(value, task, "MODEL"))


def read_directory_config(directory: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a model directory, refused with the file named when it is unusable."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise TpuAgentError(
            "no-config", f"{directory} has no config.json", "a model directory is what save_pretrained writes"
        )
    if config_path.stat().st_size > MAX_CONFIG_BYTES:
        raise TpuAgentError("config-too-large", f"{config_path} is over {MAX_CONFIG_BYTES} bytes", "is this a config?")
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TpuAgentError("bad-config", f"{config_path} is not valid JSON: {error}", "fix or regenerate it") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise TpuAgentError(
            "bad-config", f'{config_path} has no "model_type" string', "transformers writes one with save_pretrained"
        )
    return data


def _check_weight_index(directory: Path) -> None:
    """A sharded checkpoint's index may only name plain files in the directory (no ``..``, no absolute paths)."""
    for index_name in WEIGHT_INDEXES:
        index_path = directory / index_name
        if not index_path.is_file():
            continue
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8")).get("weight_map", {})
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
            raise TpuAgentError(
                "bad-weight-index", f"{index_path} is not a valid index: {error}", "regenerate it"
            ) from None
        if not isinstance(weight_map, dict):
            raise TpuAgentError("bad-weight-index", f"{index_path}: weight_map is not an object", "regenerate it")
        for shard in set(weight_map.values()):
            if not isinstance(shard, str) or Path(shard).name != shard or shard in (".", ".."):
                raise TpuAgentError(
                    "path-outside-model-dir",
                    f"{index_path} names shard {shard!r}, which is not a file inside {directory}",
                    "a weight index may only name files in its own directory",
                )


def _parse_directory(directory: Path, task: str | None) -> ModelSpec:
    if not directory.exists():
        raise TpuAgentError(
            "model-dir-missing", f"model directory {directory} does not exist (MODEL)", "check the path"
        )
    if not directory.is_dir():
        raise TpuAgentError(
            "not-a-model-dir", f"{directory} is not a directory (MODEL)", "pass the directory holding config.json"
        )
    config = read_directory_config(directory)
    model_type = config["model_type"]
    if model_type not in known_model_types():
        remote = (
            " (its auto_map points at code in the directory, which tpu-agent never runs)"
            if "auto_map" in config
            else ""
        )
        raise TpuAgentError(
            "unknown-model",
            f"{directory / 'config.json'} has model_type {model_type!r}, which this transformers does not know{remote}",
            "upgrade transformers, or pass a module:factory that builds the model",
        )
    _check_weight_index(directory)
    return ModelSpec(DIRECTORY, str(directory.resolve()), _check_task_for_type(model_type, task, str(directory)))


def _parse_factory(value: str) -> ModelSpec:
    module, _, function = value.rpartition(":")
    if not _IDENTIFIER_RE.match(function):
        raise TpuAgentError("bad-factory", f"{value!r}: {function!r} is not a function name (MODEL)", FACTORY_HINT)
    if module.endswith(".py"):
        path = Path(module)
        if not path.is_file():
            raise TpuAgentError("factory-file-missing", f"factory file {module} does not exist (MODEL)", FACTORY_HINT)
        return ModelSpec(FACTORY, f"{path.resolve()}:{function}")
    if not _MODULE_RE.match(module):
        raise TpuAgentError(
            "bad-factory", f"{value!r}: {module!r} is not a module name or .py file (MODEL)", FACTORY_HINT
        )
    return ModelSpec(FACTORY, value)


def parse_model_spec(value: str, task: str | None = None) -> ModelSpec:
    """Validate a MODEL argument: ``module:factory``, an existing directory, or a transformers model type."""
    _check_task(task)
    value = value.strip()
    if not value:
        raise TpuAgentError("unknown-model", "MODEL is empty", "e.g. tpu-agent check llama")
    looks_like_path = "/" in value or "\\" in value or value.startswith(".") or Path(value).is_dir()
    if ":" in value and not Path(value).exists() and not re.match(r"^[A-Za-z]:[\\/]", value):
        if task is not None:
            raise TpuAgentError("task-with-factory", "--task applies to Hugging Face models", "drop --task")
        return _parse_factory(value)
    if looks_like_path:
        return _parse_directory(Path(value), task)
    return _parse_hf_type(value, task)


__all__ = [
    "DIRECTORY",
    "FACTORY",
    "HF_TYPE",
    "ModelSpec",
    "known_model_types",
    "parse_model_spec",
    "read_directory_config",
]
