"""Tiny Hugging Face configs and example inputs, derived from transformers' own config classes.

transformers' test suite builds tiny models from per-model tester classes that the wheel does not ship, so a
config is shrunk here by rules: each :class:`ShrinkRule` is one record naming the attributes it touches and
the value it gives them. Rules only ever shrink (a value already below the target stays; a size a default config
leaves unset gets the tiny one), recurse into sub-configs (``text_config``, ``vision_config``, encoder/decoder),
and keep the invariants most architectures assert: heads divide the width, key/value heads divide the heads,
token ids fit the vocabulary, per-layer lists have one entry per layer and keep one layer of each kind. An
architecture whose constraints these rules miss fails to build; the caller reports it as a build error (it never
reaches the ``tpu`` device, so it says nothing about it).

Why this module is long: most of it is the rule table, one record per family of attributes, kept in one place so
that a reader sees every shrink a coverage figure rests on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TINY_LAYERS = 2
TINY_WIDTH = 64
TINY_HEADS = 4
TINY_HEAD_DIM = TINY_WIDTH // TINY_HEADS
TINY_FFN = 128
TINY_VOCAB = 256
# A derived config over this is not tiny: one of its size attributes has no rule below (reported, not run).
TINY_MAX_PARAMETERS = 50_000_000
TINY_EXPERTS = 4
TINY_MAX_POSITIONS = 512
TINY_IMAGE = 64  # pixels per side: cheap for every CNN / ViT here, and still divisible by their strides and windows
# A module list longer than this in a derived config is a depth no rule caught (a layer count in a field of its own,
# a per-layer list, a stage pattern): refused before it runs for minutes instead of seconds.
TINY_MAX_LAYER_LIST = 32
BATCH = 2
SEQ_LEN = 8

# Tasks: the transformers auto mapping whose class builds the model, and the inputs it needs.
TASK_MAPPINGS: dict[str, str] = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "base": "MODEL_MAPPING_NAMES",
}


@dataclass(frozen=True)
class ShrinkRule:
    """One shrinking rule: the config attributes it applies to and how the tiny value is computed."""

    name: str
    attributes: tuple[str, ...]
    value: Callable[[Any, dict[str, Any]], Any]  # (current value, original attributes of the config) -> new value
    why: str
    suffixes: tuple[str, ...] = ()  # also every attribute whose name ends so (a family of fields, named per model)


def _at_most(limit: int) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda value, _: min(value, limit) if isinstance(value, int) and not isinstance(value, bool) else value


def _kv_heads(value: Any, original: dict[str, Any]) -> Any:
    """Keep the attention kind: multi-head stays multi-head, grouped stays grouped (2), multi-query stays 1."""
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    heads = original.get("num_attention_heads") or original.get("n_head") or original.get("num_heads")
    if value == 1:
        return 1
    if isinstance(heads, int) and value >= heads:
        return TINY_HEADS
    return 2


def _is_int_sequence(value: Any) -> bool:
    """A per-stage list or tuple of sizes (configs store either; the shrunk value keeps the type)."""
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def _per_stage(limit: int) -> Callable[[Any, dict[str, Any]], Any]:
    """Lists with one width per stage (CNNs, hierarchical ViTs): scale every stage down, keep the ratios."""

    def shrink(value: Any, _: dict[str, Any]) -> Any:
        if not _is_int_sequence(value) or max(value) <= limit:
            return value
        top = max(value)
        return type(value)(max(8, (v * limit // top) // 8 * 8) for v in value)

    return shrink


def _depth(value: Any, original: dict[str, Any]) -> Any:
    """A depth: one number (at most :data:`TINY_LAYERS`) or one per stage (one block each)."""
    if _is_int_sequence(value):
        return type(value)(min(v, 1) for v in value)
    return _at_most(TINY_LAYERS)(value, original)


def _side(value: Any, _: dict[str, Any]) -> Any:
    """An image side (or a (height, width) pair) at most :data:`TINY_IMAGE` pixels."""
    if _is_int_sequence(value):
        return type(value)(min(v, TINY_IMAGE) for v in value)
    return _at_most(TINY_IMAGE)(value, _)


def _heads(value: Any, original: dict[str, Any]) -> Any:
    """A head count, or one per stage: a power of two at most the stage's, so it divides the shrunk stage widths
    (Swin's (3, 6, 12, 24) heads over widths 64 * 2**stage become (2, 4, 8, 16))."""
    if _is_int_sequence(value):
        return type(value)(1 << (v.bit_length() - 1) if v > 0 else v for v in value)
    return _at_most(TINY_HEADS)(value, original)


def _stage_window(value: Any, original: dict[str, Any]) -> Any:
    """A hierarchical model's attention window (Swin's 7): its last stage sees the image at 1/32 of its side, two
    tokens wide at 64 pixels, and transformers builds the position-bias table for the configured window."""
    return _at_most(2)(value, original) if "depths" in original else value


def _unless_scaled(limit: int) -> Callable[[Any, dict[str, Any]], Any]:
    """At most ``limit``, unless the config derives the value from a compound-scaling coefficient (EfficientNet's
    ``hidden_dim`` must equal its scaled last stage)."""
    return lambda value, original: value if "width_coefficient" in original else _at_most(limit)(value, original)


SHRINK_RULES: tuple[ShrinkRule, ...] = (
    ShrinkRule(
        "layers",
        (
            "num_hidden_layers",
            "num_layers",
            "n_layer",
            "n_layers",
            "encoder_layers",
            "decoder_layers",
            "num_encoder_layers",
            "num_decoder_layers",
            "decoder_num_layers",
            "text_layers",
            "num_self_attends_per_block",
            "num_blocks",
            "num_layers_per_stack",
            "speech_encoder_layers",
            "t2u_encoder_layers",
            "t2u_decoder_layers",
            "conf_num_hidden_layers",
            "num_global_layers",
        ),
        _at_most(TINY_LAYERS),
        "two layers still exercise the layer-to-layer path (and alternating layer kinds start at layer 0 and 1)",
    ),
    ShrinkRule(
        "width",
        (
            "hidden_size",
            "d_model",
            "n_embd",
            "embed_dim",
            "model_dim",
            "word_embed_proj_dim",
            "d_embed",
            "embedding_size",
            "projection_dim",
            "dim",
            "d_latents",
            "emb_dim",
            "embedding_dim",
        ),
        _at_most(TINY_WIDTH),
        "a 64-wide model keeps every code path of a 4096-wide one at a fraction of the cost",
    ),
    ShrinkRule(
        "heads",
        ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads", "num_heads"),
        _heads,
        "four heads of 16 divide the 64-wide model; per-stage head counts become powers of two (they divide the "
        "shrunk stage widths)",
    ),
    ShrinkRule(
        "kv-sharing",
        ("num_kv_shared_layers",),
        _at_most(0),
        "layers reusing an earlier layer's keys and values need an earlier layer of their kind: two layers have none",
    ),
    ShrinkRule(
        "norm-groups",
        ("num_groups",),
        _at_most(8),
        "group-norm groups divide the narrowest shrunk stage (eight channels)",
    ),
    ShrinkRule(
        "kv-heads",
        ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "num_query_groups"),
        _kv_heads,
        "grouped-query attention must stay grouped, so enable_gqa / repeat_kv paths still run",
    ),
    ShrinkRule(
        "head-dim",
        (
            "head_dim",
            "attention_head_dim",
            "kv_channels",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "v_head_dim",
            "attention_head_size",
            "d_kv",
            "rotary_dim",
        ),
        _at_most(TINY_HEAD_DIM),
        "an explicit head size follows the tiny width",
    ),
    ShrinkRule(
        "low-rank",
        ("q_lora_rank", "kv_lora_rank", "o_lora_rank", "embedding_rank", "intra_bottleneck_size", "true_hidden_size"),
        _at_most(32),
        "latent / bottleneck projections below the width",
    ),
    ShrinkRule(
        "ffn",
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "d_ff",
            "n_inner",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "moe_shared_expert_intermediate_size",
            "expert_ffn_hidden_size",
            "dense_intermediate_size",
            "dim_ff",
            "dff",
            "feed_forward_size",
            "mlp_dim",
        ),
        _at_most(TINY_FFN),
        "the feed-forward block at twice the width",
    ),
    ShrinkRule(
        "hidden-dim",
        ("hidden_dim",),
        _unless_scaled(TINY_FFN),
        "DistilBERT's feed-forward and Granite Speech's conformer width (EfficientNet derives its own from a "
        "width coefficient, and keeps it)",
    ),
    ShrinkRule(
        "experts",
        ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
        _at_most(TINY_EXPERTS),
        "four experts keep routing (top-2 of 4) and the grouped-matmul path",
    ),
    ShrinkRule(
        "experts-per-token",
        ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k"),
        _at_most(2),
        "top-2 routing",
    ),
    ShrinkRule("expert-groups", ("n_group", "num_expert_group", "topk_group"), _at_most(1), "one routing group"),
    ShrinkRule(
        "vocab",
        ("vocab_size", "vocab_size_per_layer_input"),
        _at_most(TINY_VOCAB),
        "a 256-token vocabulary (token ids are remapped); per-layer embedding tables (Gemma 3n / 4) and the other "
        "tables a model keeps (entities, hashed n-grams, glyph shapes) too",
        suffixes=("_vocab_size", "_vocab"),
    ),
    ShrinkRule(
        "per-layer-input",
        ("hidden_size_per_layer_input",),
        _at_most(16),
        "the per-layer input embedding width, which multiplies the layer count and the vocabulary",
    ),
    ShrinkRule(
        "positions",
        ("max_position_embeddings", "n_positions", "max_source_positions", "max_target_positions", "n_ctx"),
        _at_most(TINY_MAX_POSITIONS),
        "learned position tables sized for the tiny inputs",
    ),
    ShrinkRule(
        "latents",
        ("num_latents",),
        _at_most(16),
        "a Perceiver's latent array: sixteen latents keep cross- and self-attention over them",
    ),
    ShrinkRule(
        "stage-widths",
        ("hidden_sizes", "embed_dims", "neck_hidden_sizes"),
        _per_stage(64),
        "CNN / hierarchical stage widths scaled down with their ratios kept",
    ),
    ShrinkRule(
        "stage-depths",
        ("depths", "num_block_repeats", "stage_num_blocks", "block_repeats"),
        _depth,
        "one block per stage (a single depth: two blocks)",
    ),
    ShrinkRule(
        "stage-window",
        ("window_size",),
        _stage_window,
        "a window of two tokens fits every stage of a 64-pixel image (models without stages keep theirs)",
    ),
    ShrinkRule(
        "image-size",
        ("image_size",),
        _side,
        "64-pixel images: a 224-pixel one costs twelve times as much and exercises no other code path",
    ),
)

_RULE_BY_ATTRIBUTE = {attribute: rule for rule in SHRINK_RULES for attribute in rule.attributes}
_RULE_BY_SUFFIX = {suffix: rule for rule in SHRINK_RULES for suffix in rule.suffixes}


def _rule_for(name: str) -> ShrinkRule | None:
    rule = _RULE_BY_ATTRIBUTE.get(name)
    if rule is None:
        rule = next((rule for suffix, rule in _RULE_BY_SUFFIX.items() if name.endswith(suffix)), None)
    return rule


_DROPOUT_WORDS = ("dropout", "drop_rate", "drop_path")


def _fit_token_ids(config: Any, vocab: int) -> None:
    """Token ids (``*_token_id``, ``*_token_index``) must index the shrunk vocabulary."""
    for name, value in list(vars(config).items()):
        if not (name.endswith("_token_id") or name.endswith("_token_ids") or name.endswith("_token_index")):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= vocab:
            setattr(config, name, value % vocab)
        elif isinstance(value, list) and all(isinstance(v, int) for v in value):
            setattr(config, name, [v % vocab for v in value])


def _keep_kinds(per_layer: list[Any], layers: int) -> list[Any]:
    """The first ``layers`` entries of a per-layer list, with the last ones swapped for the kinds of layer they
    would drop where there is room (Gemma 3's five sliding-window layers and one global keep one of each: the
    global layer's code runs, and configs that insist on a kind being present still build)."""
    head = per_layer[:layers]
    if not all(isinstance(kind, str) for kind in per_layer):  # sizes or dilations per layer, not kinds
        return head
    missing = [kind for kind in dict.fromkeys(per_layer) if kind not in head]
    if not missing or len(missing) >= layers:
        return head
    return head[: layers - len(missing)] + missing


def _fit_per_layer_lists(config: Any, original_layers: int | None, layers: int | None, every_kind: bool) -> None:
    """Lists with one entry per layer (``layer_types``, ``mlp_only_layers``-style index lists) follow the count,
    keeping every kind of layer when ``every_kind``."""
    if not original_layers or not layers or original_layers == layers:
        return
    for name, value in list(vars(config).items()):
        if not isinstance(value, list) or not value or _rule_for(name) is not None:
            continue
        if len(value) == original_layers:
            setattr(config, name, _keep_kinds(value, layers) if every_kind else value[:layers])
        elif name.endswith(("_layers", "_idxs", "_indexes", "_indices", "_layer_ids")) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            kept = [v for v in value if v < layers]
            setattr(config, name, kept or [layers - 1])


# Names of per-layer kind lists that a config derives its layer count from (NemotronH's ``layers_block_type``).
_LAYER_PATTERN_WORDS = ("layer", "block", "pattern")


def _fit_layer_patterns(config: Any) -> None:
    """A config that stores no layer count but one kind per layer (a list of strings, or a string with one
    character per layer) gets one layer of each kind, in the order the kinds first appear: the depth becomes
    the number of kinds, and every kind of layer (attention, recurrent, MoE...) still runs."""
    for name, value in list(vars(config).items()):
        if not any(word in name for word in _LAYER_PATTERN_WORDS):
            continue
        if isinstance(value, list) and len(value) > TINY_LAYERS and all(isinstance(v, str) for v in value):
            setattr(config, name, list(dict.fromkeys(value)))
        elif isinstance(value, str) and len(value) > TINY_LAYERS and name.endswith("pattern"):
            setattr(config, name, "".join(dict.fromkeys(value)))


# Mamba-2-style mixers: (heads, head size, expansion) attribute names, with heads * head size == expansion * width.
_STATE_SPACE_HEADS = (
    ("num_heads", "head_dim", "expand"),
    ("mamba_num_heads", "mamba_head_dim", "expand"),
    ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
    ("n_mamba_heads", "mamba_headdim", "mamba_expand"),
)


def _fit_state_space_heads(config: Any) -> None:
    """A Mamba-2 mixer splits ``expand * width`` channels into heads: after the width shrank, the head count
    follows (with a head size of at most 16)."""
    values = vars(config)  # the stored values: heterogeneous configs refuse attribute reads of per-layer ones
    width = values.get("hidden_size")
    for heads_name, size_name, expand_name in _STATE_SPACE_HEADS:
        heads, size, expand = (values.get(name) for name in (heads_name, size_name, expand_name))
        if (
            not all(isinstance(v, int) and v > 0 for v in (width, heads, size, expand))
            or heads * size == expand * width
        ):
            continue
        size = min(size, 16)
        if (expand * width) % size == 0:
            setattr(config, size_name, size)
            setattr(config, heads_name, expand * width // size)
    if isinstance(values.get("mamba_d_ssm"), int) and isinstance(values.get("mamba_expand"), int) and width:
        config.mamba_d_ssm = values["mamba_expand"] * width  # Falcon-H1's explicit mixer width overrides expand


def _fill_unset_sizes(config: Any) -> None:
    """Sizes a default config leaves ``None`` for its checkpoint to set, which some models read unguarded
    (``config.head_dim ** -0.5``), and sizes it derived from the full width when it was built: given the value a
    checkpoint of the tiny shape would carry."""
    values = vars(config)
    heads, width = values.get("num_attention_heads"), values.get("hidden_size")
    if isinstance(heads, int) and heads and isinstance(width, int):
        for name, value in (("head_dim", width // heads), ("num_key_value_heads", heads)):
            if name in values and values[name] is None:
                setattr(config, name, value)
    for name, value in (("num_experts_per_tok", 2), ("vocab_size", TINY_VOCAB)):
        if name in values and values[name] is None:
            setattr(config, name, value)
    if isinstance(width, int) and isinstance(values.get("attention_hidden_size"), int):
        config.attention_hidden_size = 2 * width  # Zamba's shared attention reads the hidden state and embeddings
    if isinstance(width, int) and isinstance(values.get("mamba_dt_rank"), int):
        config.mamba_dt_rank = -(-width // 16)  # the time-step rank Mamba derives from the width
    nope, rope = values.get("qk_nope_head_dim"), values.get("qk_rope_head_dim")
    if isinstance(values.get("qk_head_dim"), int) and isinstance(nope, int) and isinstance(rope, int):
        config.qk_head_dim = nope + rope  # multi-head latent attention's query head: both parts, as shrunk


def shrink_config(config: Any, every_kind: bool = True) -> Any:
    """Shrink ``config`` (a ``PretrainedConfig``) in place by :data:`SHRINK_RULES`, recursing into sub-configs.

    ``every_kind=False`` keeps the first layers of a per-layer list as they are, for the few models that do not
    build with one layer of each kind (Zamba ties its hybrid layers' shared block, which takes two of them)."""
    from transformers import PretrainedConfig

    original = dict(vars(config))
    for name, value in original.items():
        rule = _rule_for(name)
        if isinstance(value, PretrainedConfig):
            shrink_config(value, every_kind)
        elif rule is not None:
            setattr(config, name, rule.value(value, original))
        elif any(word in name for word in _DROPOUT_WORDS) and isinstance(value, float):
            setattr(config, name, 0.0)
    layers_name = next(
        (n for n in ("num_hidden_layers", "num_layers", "n_layer") if isinstance(original.get(n), int)), None
    )
    if layers_name is not None:
        _fit_per_layer_lists(config, original[layers_name], getattr(config, layers_name), every_kind)
    else:
        _fit_layer_patterns(config)
    heads, width = vars(config).get("num_attention_heads"), vars(config).get("hidden_size")
    if isinstance(heads, int) and isinstance(width, int) and heads and width % heads:
        config.num_attention_heads = 1
    _fill_unset_sizes(config)
    _fit_state_space_heads(config)
    vocab = getattr(config, "vocab_size", None)
    if vocab is None and isinstance(vars(config).get("text_config"), PretrainedConfig):  # ids index the text model's
        vocab = getattr(config.text_config, "vocab_size", None)
    if isinstance(vocab, int):
        _fit_token_ids(config, vocab)
    languages = vars(config).get("languages")
    if "default_language" in vars(config) and config.default_language is None and languages:  # X-MOD's adapters
        config.default_language = languages[0]
    return config


def model_class_name(model_type: str, task: str) -> str | None:
    """The transformers class that builds ``model_type`` for ``task`` (``None`` when the task has none)."""
    from transformers.models.auto import modeling_auto

    name = getattr(modeling_auto, TASK_MAPPINGS[task]).get(model_type)
    return name[0] if isinstance(name, (tuple, list)) else name  # a few types list alternatives; the first is canonical


def default_task(model_type: str) -> str | None:
    """The first task (in :data:`TASK_MAPPINGS` order) that has a class for ``model_type``."""
    return next((task for task in TASK_MAPPINGS if model_class_name(model_type, task) is not None), None)


def example_inputs(model: Any, config: Any, task: str) -> dict[str, Any]:
    """Inputs the model's ``forward`` takes, from the config: token ids, a padded mask, pixels, decoder ids.

    The second sequence's last two positions are padding, so attention masks take their real (boolean or
    additive) path rather than the all-ones shortcut.
    """
    import torch

    parameters = inspect.signature(model.forward).parameters
    generator = torch.Generator().manual_seed(0)
    main_input = getattr(model, "main_input_name", "input_ids")
    inputs: dict[str, Any] = {}
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text_config, "vocab_size", None) or TINY_VOCAB
    if main_input == "pixel_values" or (task == "image-classification" and "pixel_values" in parameters):
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", TINY_IMAGE)  # a CNN without one takes any size
        size = size[0] if isinstance(size, (list, tuple)) else size
        channels = getattr(vision, "num_channels", 3)
        inputs["pixel_values"] = torch.randn(BATCH, channels, size, size, generator=generator)
    else:
        inputs["input_ids"] = torch.randint(3, vocab, (BATCH, SEQ_LEN), generator=generator)
        if "attention_mask" in parameters:
            mask = torch.ones(BATCH, SEQ_LEN, dtype=torch.long)
            mask[1, -2:] = 0
            inputs["attention_mask"] = mask
        if "decoder_input_ids" in parameters and task == "seq2seq":
            inputs["decoder_input_ids"] = torch.randint(3, vocab, (BATCH, SEQ_LEN // 2), generator=generator)
        if "bbox" in parameters:  # layout models: boxes with x0 <= x1, y0 <= y1
            corners = torch.randint(0, 500, (BATCH, SEQ_LEN, 2), generator=generator)
            inputs["bbox"] = torch.cat([corners, corners + 10], dim=-1)
    if "use_cache" in parameters:
        inputs["use_cache"] = False
    if "return_dict" in parameters:
        inputs["return_dict"] = True
    return inputs


__all__ = [
    "SHRINK_RULES",
    "TASK_MAPPINGS",
    "ShrinkRule",
    "default_task",
    "example_inputs",
    "model_class_name",
    "shrink_config",
]
