"""The engine on hard inputs: aliases, notebooks, encodings, newlines, unparsable files, symlinks, filters, pool."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from conftest import migrate_one

from tpu_agent.errors import TpuAgentError
from tpu_agent.migrate import engine
from tpu_agent.migrate.engine import build_plan
from tpu_agent.migrate.engine.context import RESOLVER_RE
from tpu_agent.migrate.model import FileKind, MigrateOptions, Target

RESOLVER = 'DEVICE = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")'


def _new(result) -> str:  # noqa: ANN001
    assert result.skipped_reason is None, result.skipped_reason
    assert result.migrated_bytes is not None
    return result.migrated_bytes.decode()


def test_aliases_and_import_forms_resolve_by_qualified_name(write) -> None:  # noqa: ANN001
    path = write(
        "a.py",
        "import torch\n"
        "import torch.cuda as tc\n"
        "from torch import cuda\n"
        "from torch.cuda import amp, synchronize\n"
        "tc.synchronize()\n"
        "cuda.empty_cache()\n"
        "synchronize()\n"
        "with amp.autocast():\n"
        "    pass\n",
    )
    new = _new(migrate_one(path))
    assert "tc." not in new and "cuda." not in new and "amp." not in new
    # the CUDA imports lost every use and are gone; torch stays
    assert "import torch.cuda" not in new and "from torch" not in new
    assert new.count("torch.accelerator.synchronize()") == 2
    assert "torch.autocast(DEVICE.type, dtype=torch.bfloat16)" in new
    ast.parse(new)


def test_names_that_only_look_like_cuda_stay(write) -> None:  # noqa: ANN001
    source = (
        "import logging\n"
        "import torch\n"
        "cuda = {'fast': True}\n"
        "cuda.get('fast')\n"
        "logging.info('moving the model to cuda')\n"
        "print(f'running on cuda:{0}')\n"
        "class Job:\n"
        "    def cuda(self):\n"
        "        return 'submitted'\n"
        "job = Job()\n"
        "job.cuda()\n"
        "kind = torch.version.__name__\n"
    )
    result = migrate_one(write("b.py", source))
    assert result.migrated_bytes is None
    assert result.findings == []


def test_nested_fstring_and_multiline_call_keep_everything_else(write) -> None:  # noqa: ANN001
    source = (
        "import torch\n"
        "rank = 0\n"
        "msg = f\"{f'cuda:{rank}'} stays\"   \n"  # trailing spaces survive
        "x = torch.zeros(\n"
        "    2,  # rows\n"
        '    device=f"cuda:{rank}",\n'
        ")\n"
        'y = x.to(device=f"cuda:{rank}") ;z = 1\n'
    )
    new = _new(migrate_one(write("c.py", source)))
    lines = new.splitlines(keepends=True)
    assert "msg = f\"{f'cuda:{rank}'} stays\"   \n" in lines
    assert "    2,  # rows\n" in lines
    rank_device = 'DEVICE if DEVICE.type in ("cpu", "tpu") else f"{DEVICE.type}:{rank}"'
    assert f"    device={rank_device},\n" in lines
    assert f"y = x.to(device={rank_device}) ;z = 1\n" in lines
    ast.parse(new)


def test_crlf_stays_crlf_and_bom_stays(write) -> None:  # noqa: ANN001
    source = "\ufeffimport torch\r\nx = torch.ones(2).cuda()\r\n"
    result = migrate_one(write("d.py", source.encode("utf-8")))
    data = result.migrated_bytes
    assert data is not None and data.startswith(b"\xef\xbb\xbf")
    assert b"\n" not in data.replace(b"\r\n", b"")
    assert b"x = torch.ones(2).to(DEVICE)\r\n" in data


def test_pep263_encoding_is_kept(write) -> None:  # noqa: ANN001
    source = "# -*- coding: latin-1 -*-\nimport torch\nname = 'caf\xe9'\nx = torch.ones(1, device='cuda')\n"
    result = migrate_one(write("e.py", source.encode("latin-1")))
    data = result.migrated_bytes
    assert data is not None
    assert b"name = 'caf\xe9'\n" in data  # still one latin-1 byte
    assert b"device=DEVICE" in data


@pytest.mark.parametrize(
    ("name", "data", "line"),
    [
        ("py2.py", b"import torch\nprint 'cuda'\n", 2),
        ("broken.py", b"import torch\nx = torch.cuda.synchronize(\n", 2),
        ("bytes.py", b"import torch\nx = 'cuda'\ny = '\xff\xfe'\n", 3),
        ("nul.py", b"import torch\nx = 'cuda'\x00\n", 2),
    ],
)
def test_unparsable_files_are_skipped_with_path_and_line(write, name: str, data: bytes, line: int) -> None:  # noqa: ANN001
    result = migrate_one(write(name, data))
    assert result.migrated_bytes is None
    assert result.findings == []
    assert result.skipped_reason is not None
    assert result.skipped_reason.startswith(f"{result.display_path}:{line}"), result.skipped_reason


def test_notebook_code_cells_only_magics_and_outputs_untouched(write) -> None:  # noqa: ANN001
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["Runs on `cuda`.\n"]},
            {
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {"tags": ["setup"]},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["cuda\n"]}],
                "source": [
                    "%matplotlib inline\n",
                    "!pip install einops\n",
                    "import torch\n",
                    "import torch.cuda as tc",
                ],
            },
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": "%%bash\necho cuda",
            },
            {
                "cell_type": "code",
                "execution_count": 2,
                "metadata": {},
                "outputs": [],
                "source": ["x = torch.ones(2).cuda()\n", "if True:\n", "    !nvidia-smi\n", "tc.synchronize()"],
            },
        ],
        "metadata": {"kernelspec": {"name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    original = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    path = write("nb.ipynb", original)
    result = migrate_one(path)
    assert result.kind is FileKind.NOTEBOOK
    new = json.loads(_new(result))
    cells = new["cells"]
    assert cells[0] == notebook["cells"][0]
    assert cells[2] == notebook["cells"][2]  # the %%bash cell
    setup = cells[1]
    assert setup["outputs"] == notebook["cells"][1]["outputs"] and setup["metadata"] == {"tags": ["setup"]}
    assert setup["source"][:2] == ["%matplotlib inline\n", "!pip install einops\n"]
    assert RESOLVER + "\n" in setup["source"] or RESOLVER in setup["source"]
    assert cells[3]["source"] == [
        "x = torch.ones(2).to(DEVICE)\n",
        "if True:\n",
        "    !nvidia-smi\n",
        "if torch.accelerator.is_available():\n",
        "    torch.accelerator.synchronize()",
    ]
    # findings point into the cell (1-based cell number in the message, line within the cell)
    cuda_call = next(f for f in result.findings if f.code == "TPU103")
    assert cuda_call.line == 1 and cuda_call.message.startswith("cell 4:")
    # the layout (indent=1, trailing newline) is the notebook's own; only sources changed
    rewritten = result.migrated_bytes.decode()
    assert rewritten == json.dumps(new, indent=1, ensure_ascii=False) + "\n"
    # idempotent
    path.write_bytes(result.migrated_bytes)
    assert migrate_one(path).migrated_bytes is None


def test_invalid_notebook_is_skipped(write) -> None:  # noqa: ANN001
    result = migrate_one(write("bad.ipynb", "{ not json cuda"))
    assert result.skipped_reason is not None and "bad.ipynb" in result.skipped_reason


def test_import_torch_added_when_missing_and_alias_reused(write) -> None:  # noqa: ANN001
    new = _new(migrate_one(write("f.py", '"""Doc."""\nfrom torch import nn\n\nlayer = nn.Linear(2, 2).cuda()\n')))
    assert new.startswith('"""Doc."""\nfrom torch import nn\nimport torch\n')
    assert RESOLVER in new
    aliased = _new(
        migrate_one(write("g.py", "import torch as th\nth.cuda.synchronize()\nx = th.ones(1, device='cuda')\n"))
    )
    assert "import torch\n" not in aliased
    assert 'DEVICE = th.accelerator.current_accelerator(check_available=True) or th.device("cpu")' in aliased
    assert "th.accelerator.synchronize()" in aliased


def test_user_device_name_is_not_shadowed(write) -> None:  # noqa: ANN001
    path = write("h.py", "import torch\nDEVICE = 'cuda'\nx = torch.zeros(1, device='cuda')\n")
    new = _new(migrate_one(path))
    assert "TPU_AGENT_DEVICE = torch.accelerator" in new
    assert "DEVICE = TPU_AGENT_DEVICE.type" in new and "device=TPU_AGENT_DEVICE)" in new
    path.write_text(new)
    assert migrate_one(path).migrated_bytes is None


def test_cuda_import_stays_while_code_still_refers_to_it(write) -> None:  # noqa: ANN001
    # the mirror of fixtures/TPU301_import_named_in_comments: a real reference (a value use the rule leaves for a
    # person, an ``__all__`` export) keeps the import, where a comment or a string does not
    source = (
        "from torch.cuda.amp import GradScaler, autocast\n"
        "__all__ = ['GradScaler']\n"
        "def step(model, x):\n"
        "    with autocast():  # autocast\n"
        "        return model(x)\n"
        "amp_context = autocast\n"
    )
    new = _new(migrate_one(write("amp_kept.py", source)))
    assert new.startswith("from torch.cuda.amp import GradScaler, autocast\n")
    assert "torch.autocast(DEVICE.type, dtype=torch.bfloat16)" in new


def test_docstring_text_decides_no_name(write) -> None:  # noqa: ANN001
    # an example in a docstring binds nothing: the resolver is still added, the torch alias still used, and a
    # DEVICE that only a docstring mentions does not make the resolver take another name
    docstring = f'"""Usage:\n\nimport torch\n{RESOLVER}\n"""\n'
    new = _new(migrate_one(write("doc.py", docstring + "import torch as th\nx = th.ones(1).cuda()\n")))
    assert new.count("DEVICE = th.accelerator.current_accelerator(check_available=True)") == 1
    assert "x = th.ones(1).to(DEVICE)" in new and "\nimport torch\n" not in new.removeprefix(docstring)


def test_resolver_goes_before_first_module_level_use(write) -> None:  # noqa: ANN001
    source = "import os\nimport torch\nprint('x')\ndevice = 'cuda'\nimport sys\n"
    new = _new(migrate_one(write("i.py", source)))
    assert new.index("DEVICE = torch.accelerator") < new.index("device = DEVICE.type")
    assert RESOLVER_RE.search(new)


def test_tpu_target_writes_literal_tpu_and_no_resolver(write) -> None:  # noqa: ANN001
    source = (
        "import torch\nx = torch.ones(1).cuda()\ntorch.cuda.synchronize()\nwith torch.autocast('cuda'):\n    pass\n"
    )
    new = _new(migrate_one(write("j.py", source), target=Target.TPU))
    assert "DEVICE" not in new
    assert 'x = torch.ones(1).to("tpu")' in new
    assert "torch.accelerator.synchronize()\n" in new and "is_available" not in new
    assert "torch.autocast('tpu', dtype=torch.bfloat16)" in new


def test_select_and_ignore_filter_by_prefix(write) -> None:  # noqa: ANN001
    path = write("k.py", "import torch\ntorch.cuda.synchronize()\nx = torch.ones(1).cuda()\n")
    only_api = migrate_one(path, select=frozenset({"TPU2"}))
    assert {f.code for f in only_api.findings} == {"TPU202"}
    assert ".cuda()" in _new(only_api)
    no_api = migrate_one(path, ignore=frozenset({"TPU202"}))
    assert {f.code for f in no_api.findings} == {"TPU103"}
    assert "torch.cuda.synchronize()" in _new(no_api)


def test_annotate_is_idempotent(write) -> None:  # noqa: ANN001
    path = write("l.py", "import torch\nif True:\n    torch.cuda.ipc_collect()\n")
    first = _new(migrate_one(path, annotate=True))
    assert "    # TODO(tpu-agent TPU210): torch.cuda.ipc_collect: " in first
    path.write_text(first)
    assert migrate_one(path, annotate=True).migrated_bytes is None


def test_prefilter_and_cuda_sources(write) -> None:  # noqa: ANN001
    plain = migrate_one(write("m.py", "import torch\nx = torch.ones(2)\n"))
    assert plain.prefiltered and plain.migrated_bytes is None and plain.lines == 2
    kernel = migrate_one(write("k.cuh", "__global__ void scale(float* x) { x[0] *= 2; }\n"))
    assert kernel.kind is FileKind.CUDA_SOURCE
    assert [f.code for f in kernel.findings] == ["TPU801"] and "scale" in kernel.findings[0].message


def test_discovery_skips_tool_dirs_and_escaping_symlinks(tmp_path: Path, write) -> None:  # noqa: ANN001
    cuda = "import torch\nx = torch.ones(1).cuda()\n"
    write("proj/train.py", cuda)
    write("proj/.git/hooks/x.py", cuda)
    write("proj/venv/pyvenv.cfg", "home = /usr\n")
    write("proj/venv/lib/y.py", cuda)
    write("proj/node_modules/z.py", cuda)
    write("proj/pkg/__pycache__/w.py", cuda)
    write("proj/build/v.py", cuda)
    write("proj/notes.txt", "cuda")
    outside = write("elsewhere/secret.py", cuda)
    (tmp_path / "proj" / "link.py").symlink_to(outside)
    (tmp_path / "proj" / "inner.py").symlink_to(tmp_path / "proj" / "train.py")
    (tmp_path / "proj" / "linkdir").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    plan = build_plan([tmp_path / "proj"], MigrateOptions(jobs=1))
    names = [Path(f.display_path).name for f in plan.files]
    assert names == ["inner.py", "link.py", "train.py"]
    inner, link, train = plan.files
    assert train.changed
    assert link.skipped_reason is not None and "outside" in link.skipped_reason and not link.changed
    assert inner.skipped_reason is not None and "real path" in inner.skipped_reason


def test_bad_paths_raise_clear_errors(tmp_path: Path, write) -> None:  # noqa: ANN001
    with pytest.raises(TpuAgentError) as missing:
        build_plan([tmp_path / "nope.py"], MigrateOptions())
    assert "nope.py" in missing.value.message
    with pytest.raises(TpuAgentError) as unsupported:
        build_plan([write("README.txt", "cuda")], MigrateOptions())
    assert unsupported.value.code == "unsupported-file" and "README.txt" in unsupported.value.message


def test_display_path_is_relative_to_cwd(tmp_path: Path, write, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    write("proj/sub/a.py", "import torch\nx = torch.ones(1).cuda()\n")
    monkeypatch.chdir(tmp_path / "proj")
    plan = build_plan([Path("sub")], MigrateOptions(jobs=1))
    assert plan.files[0].display_path == os.path.join("sub", "a.py")
    assert plan.files[0].findings[0].path == os.path.join("sub", "a.py")
    assert plan.files[0].path == tmp_path / "proj" / "sub" / "a.py"


@pytest.mark.slow
def test_pool_keeps_input_order_and_reports_progress(tmp_path: Path, write, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(engine, "POOL_MIN_BYTES", 0)  # small files, so that the test stays fast, still use the pool
    body = "import torch\n" + "".join(f"x{i} = torch.ones(1).cuda()\n" for i in range(60))
    for i in range(6):
        write(f"proj/m{i}.py", body.replace("x", f"v{i}_"))
    write("proj/plain.py", "print('no accelerator here')\n")
    calls: list[tuple[int, int]] = []
    parallel = build_plan([tmp_path / "proj"], MigrateOptions(jobs=2), progress=lambda d, t: calls.append((d, t)))
    serial = build_plan([tmp_path / "proj"], MigrateOptions(jobs=1))
    assert [f.display_path for f in parallel.files] == [f.display_path for f in serial.files]
    assert [f.migrated_bytes for f in parallel.files] == [f.migrated_bytes for f in serial.files]
    assert [len(f.findings) for f in parallel.files] == [60] * 6 + [0]
    assert calls == [(i, 7) for i in range(1, 8)]


def test_plain_cuda_module_import_becomes_import_torch(write) -> None:  # noqa: ANN001
    source = "import torch.cuda\ntorch.set_default_device('cuda')\ntorch.cuda.synchronize()\n"
    new = _new(migrate_one(write("n.py", source)))
    assert new.startswith("import torch\n") and "torch.cuda" not in new
    assert "torch.set_default_device(DEVICE)" in new
    kept = _new(
        migrate_one(write("o.py", "import torch.cuda\ntorch.cuda.synchronize()\nx = torch.cuda.default_stream()\n"))
    )
    assert kept.startswith("import torch.cuda\n")  # a torch.cuda use is left (reported), so the import stays


_HEAD = "import torch\nfrom torch.backends.cuda import SDPBackend\ntorch.cuda.synchronize()\n"


@pytest.mark.parametrize(
    ("body", "shortcut"),
    [
        ("def f():\n    return SDPBackend.MATH\n", True),  # read once, after its only binding
        ("def f(SDPBackend):\n    return SDPBackend.MATH\n", False),  # a parameter of the same name
        ("x = 1\n", False),  # only the import itself mentions it: unused
        ("SDPBackend = None\nprint(SDPBackend)\n", False),  # bound twice
        ("def f():\n    global SDPBackend\n    return SDPBackend\n", False),
    ],
)
def test_unused_import_shortcut_agrees_with_the_scope_analysis(write, monkeypatch, body, shortcut) -> None:  # noqa: ANN001
    """The stdlib proof that a CUDA import is still read (skipping libcst's scope analysis of the output) gives
    the same output as that analysis, and fires where it should (else the test would compare nothing)."""
    from tpu_agent.migrate.engine import imports

    fired: list[bool] = []
    proof = imports._surely_read
    monkeypatch.setattr(imports, "_surely_read", lambda code, names: fired.append(proof(code, names)) or fired[-1])
    quick = _new(migrate_one(write("a.py", _HEAD + body)))
    monkeypatch.setattr(imports, "_surely_read", lambda code, names: False)
    full = _new(migrate_one(write("b.py", _HEAD + body)))
    assert quick == full
    assert any(fired) is shortcut
