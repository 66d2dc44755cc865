"""The def-use analysis behind value-following rewrites: verdicts per name, attribute and argparse option."""

from __future__ import annotations

from tpu_agent.migrate.analysis.valueflow import Verdict, analyse, argparse_dest, attr_key, name_key


def test_device_only_uses_through_copies_and_keywords() -> None:
    flow = analyse(
        'dev = "cuda"\nplace = dev\nmodel.to(place)\nbuild(device=dev)\n'
        'print(f"on {dev}")\nif dev == "cuda":\n    pass\n'
    )
    assert flow.flow(name_key("dev")).verdict is Verdict.DEVICE
    assert flow.flow(name_key("place")).verdict is Verdict.DEVICE


def test_attribute_keys_cover_argparse_namespaces_and_configs() -> None:
    flow = analyse("args.dist_backend = 'nccl'\ndist.init_process_group(backend=args.dist_backend)\n")
    assert flow.flow(attr_key("dist_backend")).verdict is Verdict.BACKEND
    assert argparse_dest(["-b", "--dist-backend"], None) == "dist_backend"
    assert argparse_dest(["--x"], "other") == "other"


def test_mixed_uses_list_the_other_lines() -> None:
    flow = analyse('t = "cuda"\nm.to(t)\nk = TABLE[t]\nif t.startswith("cu"):\n    pass\n')
    result = flow.flow(name_key("t"))
    assert result.verdict is Verdict.MIXED
    assert result.other_lines == (3, 4)
    assert result.position_lines == (2,)


def test_no_device_position_means_no_verdict() -> None:
    flow = analyse('label = "cuda"\nprint(label)\nsave(label)\n')
    assert flow.flow(name_key("label")).verdict is None


def test_unparsable_source_gives_an_empty_flow() -> None:
    assert analyse("def (:\n").flow(name_key("x")).verdict is None


def test_device_api_arguments_are_device_positions() -> None:
    # nanoGPT's DDP setup: the device string also selects the rank's device; a comparison stays rewritable
    flow = analyse(
        'device = "cuda"\nif ddp:\n    device = f"cuda:{rank}"\n    torch.cuda.set_device(device)\n'
        "torch.accelerator.synchronize(device)\nmodel.to(device)\n"
        "device_type = 'cuda' if 'cuda' in device else 'cpu'\n"
    )
    assert flow.flow(name_key("device")).verdict is Verdict.DEVICE
