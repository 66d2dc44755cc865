"""MODEL parsing, tiny configs and tensor comparison: the fast, in-process parts of ``tpu-agent check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tpu_agent.check.compare import compare_named, compare_tensor, flatten_tensors, tolerances
from tpu_agent.check.localise import OpRecord, first_diverging_op
from tpu_agent.check.spec import DIRECTORY, FACTORY, HF_TYPE, parse_model_spec
from tpu_agent.check.tiny import TINY_VOCAB, example_inputs, shrink_config
from tpu_agent.errors import ExitCode, TpuAgentError

FACTORIES = Path(__file__).with_name("factories.py")


def _refused(value: str, code: str, task: str | None = None) -> TpuAgentError:
    with pytest.raises(TpuAgentError) as caught:
        parse_model_spec(value, task)
    assert caught.value.code == code, caught.value
    assert caught.value.exit_code == ExitCode.USAGE
    return caught.value


def test_hf_type_gets_its_first_task() -> None:
    assert parse_model_spec("llama").__dict__ == {"kind": HF_TYPE, "target": "llama", "task": "causal-lm"}
    assert parse_model_spec("vit").task == "image-classification"
    assert parse_model_spec("t5", "seq2seq").task == "seq2seq"


def test_unknown_type_suggests_close_names() -> None:
    error = _refused("lama", "unknown-model")
    assert "llama" in error.hint and "'lama'" in error.message


def test_task_the_type_lacks_names_the_ones_it_has() -> None:
    error = _refused("vit", "task-not-supported", task="causal-lm")
    assert "image-classification" in error.hint
    _refused("llama", "unknown-task", task="translation")


def test_missing_directory_and_directory_without_config(tmp_path: Path) -> None:
    assert str(tmp_path / "nope") in _refused(str(tmp_path / "nope"), "model-dir-missing").message
    assert "config.json" in _refused(str(tmp_path), "no-config").message


def test_crafted_config_files_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text("{not json", encoding="utf-8")
    assert str(config) in _refused(str(tmp_path), "bad-config").message
    config.write_text("[1, 2]", encoding="utf-8")
    _refused(str(tmp_path), "bad-config")
    config.write_text(
        json.dumps({"model_type": "evil", "auto_map": {"AutoModel": "modeling_evil.Evil"}}), encoding="utf-8"
    )
    assert "never runs" in _refused(str(tmp_path), "unknown-model").message


def test_weight_index_naming_files_outside_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    index = {"weight_map": {"lm_head.weight": "../../etc/passwd"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    _refused(str(tmp_path), "path-outside-model-dir")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    assert parse_model_spec(str(tmp_path)).kind == DIRECTORY


def test_factory_forms(tmp_path: Path) -> None:
    assert parse_model_spec("mypkg.models:make").__dict__ == {
        "kind": FACTORY,
        "target": "mypkg.models:make",
        "task": None,
    }
    assert parse_model_spec(f"{FACTORIES}:good_mlp").target == f"{FACTORIES.resolve()}:good_mlp"
    _refused(f"{tmp_path / 'missing.py'}:make", "factory-file-missing")
    _refused("mypkg.models:not-a-name", "bad-factory")
    _refused("my pkg:make", "bad-factory")
    _refused("mypkg:make", "task-with-factory", task="causal-lm")


def test_shrunk_llama_is_tiny_and_keeps_grouped_attention() -> None:
    from transformers import AutoConfig

    config = shrink_config(AutoConfig.for_model("llama", num_key_value_heads=8))
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 64, 4)
    assert config.num_key_value_heads == 2  # grouped stays grouped
    assert config.vocab_size == TINY_VOCAB
    assert all(token < TINY_VOCAB for token in (config.bos_token_id, config.eos_token_id) if token is not None)


def test_shrink_recurses_into_sub_configs_and_fits_per_layer_lists() -> None:
    from transformers import AutoConfig

    t5 = shrink_config(AutoConfig.for_model("t5"))
    assert (t5.num_layers, t5.num_decoder_layers, t5.d_model, t5.d_ff) == (2, 2, 64, 128)
    qwen3 = shrink_config(AutoConfig.for_model("qwen3"))
    assert len(qwen3.layer_types) == qwen3.num_hidden_layers == 2


def test_example_inputs_pad_the_second_sequence() -> None:
    from transformers import AutoConfig, BertForMaskedLM

    config = shrink_config(AutoConfig.for_model("bert"))
    inputs = example_inputs(BertForMaskedLM(config), config, "masked-lm")
    assert inputs["attention_mask"][1, -2:].tolist() == [0, 0] and inputs["attention_mask"][0].all()
    assert int(inputs["input_ids"].max()) < config.vocab_size


def test_tolerance_scales_with_the_tensor() -> None:
    ref = torch.tensor([1000.0, 1e-9])
    assert compare_tensor("x", ref + torch.tensor([1e-3, 1e-9]), ref).ok  # 1e-3 is within 1e-5 * 1000
    assert not compare_tensor("x", ref + torch.tensor([0.1, 0.0]), ref).ok


def test_graphs_xla_compiled_are_held_to_torchs_compiled_graph_bound() -> None:
    """XLA reorders long sums: Mamba2's D gradient came out 1.2x past the eager bound with nothing wrong."""
    ref = torch.tensor([4.0, -2.0, 0.5])
    reordered = ref + torch.tensor([1.2 * (1e-6 + 1e-5 * 4.0), 0.0, 0.0])
    assert not compare_tensor("D", reordered, ref).ok
    assert compare_tensor("D", reordered, ref, tolerances(through_xla=True)).ok
    wrong = ref + torch.tensor([1e-3, 0.0, 0.0])  # a wrong lowering is far past either bound
    assert not compare_tensor("D", wrong, ref, tolerances(through_xla=True)).ok
    assert not compare_named({"D": reordered}, {"D": ref}, table=tolerances(through_xla=False))[0].ok
    # bfloat16 is bound by its mantissa, not by who computed it
    assert tolerances(through_xla=True)["bfloat16"] == tolerances(through_xla=False)["bfloat16"]


def test_structural_differences_are_mismatches() -> None:
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare_tensor("x", ref.clone(), ref).ok
    assert compare_tensor("x", torch.tensor([1.0, 0.0, float("inf")]), ref).problem == "NaN/inf in different places"
    assert "shape" in compare_tensor("x", torch.zeros(2), torch.zeros(3)).problem
    assert "dtype" in compare_tensor("x", torch.zeros(2, dtype=torch.float64), torch.zeros(2)).problem
    assert not compare_tensor("i", torch.tensor([1, 2]), torch.tensor([1, 3])).ok
    assert compare_tensor("i", None, torch.zeros(1)).problem == "present on cpu only"


def test_a_zero_gradient_matches_none_but_an_absent_output_does_not() -> None:
    zeros, ones = {"w": torch.zeros(2, 3)}, {"w": torch.ones(2, 3)}
    assert all(d.ok for d in compare_named(zeros, {}, absent_is_zero=True))  # torch.compile's zeros, eager's None
    assert all(d.ok for d in compare_named({}, zeros, absent_is_zero=True))
    assert compare_named(ones, {}, absent_is_zero=True)[0].problem == "present on tpu only"
    assert compare_named(zeros, {})[0].problem == "present on tpu only"  # outputs: every tensor must be there


def test_flatten_names_nested_outputs() -> None:
    out = {"logits": torch.zeros(1), "hidden": (torch.zeros(1), torch.zeros(2)), "cache": object()}
    assert [name for name, _ in flatten_tensors(out)] == ["logits", "hidden.0", "hidden.1"]


def test_first_diverging_op_pairs_by_name_and_line() -> None:
    one, two = {"output": torch.ones(2)}, {"output": torch.full((2,), 2.0)}
    cpu = [OpRecord("aten::tanh", "m.py:3", one), OpRecord("aten::mul", "loss.py:9", one)]
    same = [OpRecord("aten::tanh", "m.py:3", one), OpRecord("aten::mul", "loss.py:9", one)]
    assert first_diverging_op(cpu, same) is None
    branch = [
        OpRecord("aten::tanh", "m.py:3", one),
        OpRecord("aten::mul", "m.py:4", two),
        OpRecord("aten::mul", "loss.py:9", two),
    ]
    op, why = first_diverging_op(cpu, branch)
    assert (op.name, op.location) == ("aten::mul", "m.py:4") and "tpu only" in why
    raising = [OpRecord("aten::tanh", "m.py:3", None, "RuntimeError: boom")]
    assert first_diverging_op(cpu, raising)[1] == "raises on tpu: RuntimeError: boom"


def test_a_selecting_op_whose_indices_alone_differ_is_reported_as_a_tie_order() -> None:
    """AfMoE's zero-initialised router ties every expert: XLA picks the lowest indices, the CPU kernel others."""
    scores = torch.zeros(2, 4)
    values, cpu_indices = torch.topk(scores, 2)
    cpu = [OpRecord("aten::topk", "modeling_afmoe.py:148", {"0": values, "1": cpu_indices})]
    tied = [OpRecord("aten::topk", "modeling_afmoe.py:148", {"0": values, "1": torch.tensor([[0, 1], [0, 1]])})]
    if torch.equal(cpu_indices, tied[0].outputs["1"]):  # this CPU kernel happens to pick the same: make them differ
        tied = [OpRecord("aten::topk", "modeling_afmoe.py:148", {"0": values, "1": torch.tensor([[3, 2], [3, 2]])})]
    op, why = first_diverging_op(cpu, tied)
    assert op.name == "aten::topk" and "only the indices differ" in why and "ties" in why
    moved = [OpRecord("aten::topk", "modeling_afmoe.py:148", {"0": values + 1, "1": tied[0].outputs["1"]})]
    assert "ties" not in first_diverging_op(cpu, moved)[1]  # values that differ are not a tie order
    other = [OpRecord("aten::mul", "m.py:1", {"0": values, "1": tied[0].outputs["1"]})]
    assert "ties" not in first_diverging_op([OpRecord("aten::mul", "m.py:1", cpu[0].outputs)], other)[1]


def test_model_directory_over_the_size_limit_is_refused_before_allocating(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from tpu_agent.check.build import build

    AutoConfig.for_model("vit").save_pretrained(tmp_path)  # a full-size ViT-Base config: 86M parameters
    with pytest.raises(TpuAgentError) as caught:
        build(parse_model_spec(str(tmp_path)), max_parameters=1000)
    assert caught.value.exit_code == ExitCode.USAGE
    assert "over the 1,000 limit" in caught.value.message and "config.json" in caught.value.message


def test_shrink_keeps_derived_sizes_consistent_and_every_table_tiny() -> None:
    from transformers import AutoConfig

    for model_type, heads, size, expand in (
        ("mamba2", "num_heads", "head_dim", "expand"),
        ("bamba", "mamba_n_heads", "mamba_d_head", "mamba_expand"),
        ("zamba2", "n_mamba_heads", "mamba_headdim", "mamba_expand"),
    ):
        config = shrink_config(AutoConfig.for_model(model_type))
        assert getattr(config, heads) * getattr(config, size) == getattr(config, expand) * config.hidden_size
    perceiver = shrink_config(AutoConfig.for_model("perceiver"))
    assert (perceiver.num_latents, perceiver.d_latents, perceiver.num_self_attends_per_block) == (16, 64, 2)
    gemma4 = shrink_config(AutoConfig.for_model("gemma4_text"))  # a per-layer embedding table per token and layer
    assert gemma4.vocab_size_per_layer_input == TINY_VOCAB and gemma4.hidden_size_per_layer_input == 16
    xmod = shrink_config(AutoConfig.for_model("xmod"))
    assert xmod.default_language == xmod.languages[0]


def test_a_derived_config_that_is_not_tiny_is_refused_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpu_agent.check import tiny
    from tpu_agent.check.build import build

    monkeypatch.setattr(tiny, "TINY_MAX_PARAMETERS", 1000)  # llama's tiny config has ~115k parameters
    with pytest.raises(TpuAgentError) as caught:
        build(parse_model_spec("llama"), max_parameters=10**9)
    assert caught.value.code == "tiny-config-too-large" and "LlamaConfig" in caught.value.message


def test_depth_is_capped_wherever_the_config_keeps_it() -> None:
    from transformers import AutoConfig

    # Nemotron 3.5's language model derives its 52 layers from a per-layer kind list: one layer of each kind stays
    speech = shrink_config(AutoConfig.for_model("nemo_speechlm"))
    assert speech.text_config.layers_block_type == ["linear_attention", "moe", "full_attention"]
    assert speech.audio_token_id < TINY_VOCAB  # a composite config's ids index its text model's vocabulary
    assert shrink_config(AutoConfig.for_model("xlstm")).num_blocks == 2  # 32 before
    assert shrink_config(AutoConfig.for_model("hrm_text")).num_layers_per_stack == 2  # 16 before
    gemma3 = shrink_config(AutoConfig.for_model("gemma3_text"))  # five sliding-window layers to one global
    assert gemma3.layer_types == ["sliding_attention", "full_attention"]


def test_a_derived_config_still_too_deep_is_refused_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpu_agent.check import tiny
    from tpu_agent.check.build import build

    monkeypatch.setattr(tiny, "TINY_MAX_LAYER_LIST", 1)
    with pytest.raises(TpuAgentError) as caught:
        build(parse_model_spec("llama"), max_parameters=10**9)
    assert caught.value.code == "tiny-config-too-deep"
    assert "model.layers" in caught.value.message and "LlamaConfig" in caught.value.message


def test_vision_configs_shrink_images_stages_and_windows() -> None:
    from transformers import AutoConfig, ResNetForImageClassification

    from tpu_agent.check.tiny import TINY_IMAGE

    assert shrink_config(AutoConfig.for_model("vit")).image_size == TINY_IMAGE
    assert tuple(shrink_config(AutoConfig.for_model("pvt_v2")).image_size) == (TINY_IMAGE, TINY_IMAGE)
    convnext = shrink_config(AutoConfig.for_model("convnext"))  # stored as tuples
    assert (convnext.depths, convnext.hidden_sizes) == ((1, 1, 1, 1), (8, 16, 32, 64))
    swin = shrink_config(AutoConfig.for_model("swin"))  # heads divide every stage width; the window fits 2 tokens
    assert (swin.num_heads, swin.window_size) == ((2, 4, 8, 16), 2)
    resnet = shrink_config(AutoConfig.for_model("resnet"))  # keeps no image size: takes the tiny one
    pixels = example_inputs(ResNetForImageClassification(resnet), resnet, "image-classification")["pixel_values"]
    assert pixels.shape == (2, 3, TINY_IMAGE, TINY_IMAGE)


def test_image_classifiers_that_read_tokens_get_tokens() -> None:
    from transformers import AutoConfig, ImageGPTForImageClassification

    config = shrink_config(AutoConfig.for_model("imagegpt"))
    inputs = example_inputs(ImageGPTForImageClassification(config), config, "image-classification")
    assert "pixel_values" not in inputs and int(inputs["input_ids"].max()) < config.vocab_size


def test_composite_configs_and_unset_sizes_give_what_the_class_reads() -> None:
    import transformers
    from transformers import AutoConfig

    from tpu_agent.check.build import _part_for

    qwen = _part_for(transformers.Qwen3_5ForCausalLM, shrink_config(AutoConfig.for_model("qwen3_5")))
    assert type(qwen).__name__ == "Qwen3_5TextConfig" and qwen.vocab_size == TINY_VOCAB
    ministral = shrink_config(AutoConfig.for_model("ministral"))  # head_dim is None in the default config
    assert ministral.head_dim == ministral.hidden_size // ministral.num_attention_heads
    assert shrink_config(AutoConfig.for_model("granite_speech")).encoder_config.hidden_dim == 128  # 51M params before
    assert shrink_config(AutoConfig.for_model("efficientnet")).hidden_dim == 2560  # derived from its width coefficient
    kimi = shrink_config(AutoConfig.for_model("kimi_linear"))  # latent attention's query head is both parts
    assert kimi.qk_head_dim == kimi.qk_nope_head_dim + kimi.qk_rope_head_dim and kimi.num_experts_per_token == 2


def test_a_model_refusing_one_layer_of_each_kind_gets_its_first_layers() -> None:
    from tpu_agent.check.build import build

    # Zamba ties its hybrid layers' shared block, which needs two of them: its two first (Mamba) layers build
    built = build(parse_model_spec("zamba"), max_parameters=10**9)
    assert built.model.config.layers_block_type == ["linear_attention", "linear_attention"]
