"""A Llama-style causal LM (transformers' LlamaForCausalLM built from a config) trained with FSDP2 and AdamW, as
a user would write it for a TPU slice: the model is created on the device (``with torch.device("tpu")``), each
decoder layer and then the root are ``fully_shard``-ed, and each step logs its loss.

Sizes come from the command line (a preset's sizes win over the size options), so the same script is a tiny
model in a quick test and a 7B model (``--preset 7b``: Llama-2-7B's shapes) for an estimate in capture-only
mode."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

PRESETS = {
    "7b": {"hidden": 4096, "intermediate": 11008, "layers": 32, "heads": 32, "kv_heads": 32, "vocab": 32000},
    # Llama 3.1 8B (MaxText's llama3.1-8b): grouped-query attention, 128K vocabulary
    "8b": {"hidden": 4096, "intermediate": 14336, "layers": 32, "heads": 32, "kv_heads": 8, "vocab": 128256},
}


def chunk_loss(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(head(hidden).float().flatten(0, 1), labels.flatten())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--intermediate", type=int, default=176)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    parser.add_argument(
        "--compute-dtype",
        choices=("bfloat16",),
        help="FSDP2 mixed precision: parameters and optimizer state stay in --dtype, forward and backward in this "
        "dtype, gradients reduced in float32 (MaxText's and TorchTitan's default for bf16 training)",
    )
    parser.add_argument("--no-fsdp", action="store_true", help="train the model unsharded (no process group)")
    parser.add_argument("--checkpointing", action="store_true", help="HF gradient_checkpointing_enable()")
    parser.add_argument(
        "--loss-chunks", type=int, default=1, help="f32 logits and loss a sequence chunk at a time, recomputed"
    )
    args = parser.parse_args()
    sizes = dict(vars(args))
    sizes.update(PRESETS.get(args.preset or "", {}))

    if not args.no_fsdp:
        dist.init_process_group("tpu_dist")
    device = torch.device("tpu")
    config = LlamaConfig(
        vocab_size=sizes["vocab"],
        hidden_size=sizes["hidden"],
        intermediate_size=sizes["intermediate"],
        num_hidden_layers=sizes["layers"],
        num_attention_heads=sizes["heads"],
        num_key_value_heads=sizes["kv_heads"],
        max_position_embeddings=max(args.seq, 128),
        attn_implementation=args.attention,
    )
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(config).to(getattr(torch, args.dtype))
    if args.checkpointing:
        model.gradient_checkpointing_enable()
        # training without a KV cache makes transformers look for packed sequences in the position ids, a branch
        # on their values that capture-only mode cannot take; these batches are never packed
        import transformers.masking_utils

        transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None
    if not args.no_fsdp:
        policy = MixedPrecisionPolicy(
            param_dtype=getattr(torch, args.compute_dtype) if args.compute_dtype else None,
            reduce_dtype=torch.float32 if args.compute_dtype else None,
        )
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=policy)
        if args.loss_chunks > 1:  # the loss calls the body and the head itself, so each is a unit of its own
            fully_shard(model.model, mp_policy=policy)
            fully_shard(model.lm_head, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

    for step in range(args.steps):
        tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1))
        inputs, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
        if args.loss_chunks > 1:  # a 128K vocabulary's f32 logits, whole, are several times the model's own HBM
            hidden = model.model(input_ids=inputs).last_hidden_state
            loss = (
                sum(
                    torch.utils.checkpoint.checkpoint(chunk_loss, model.lm_head, h, y, use_reentrant=False)
                    for h, y in zip(hidden.chunk(args.loss_chunks, 1), labels.chunk(args.loss_chunks, 1), strict=True)
                )
                / args.loss_chunks
            )
        else:
            logits = model(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.4f}")
    if not args.no_fsdp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
