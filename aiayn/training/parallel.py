"""Where the model lives during training: one device, or several processes (torchrun).

* One process: the model, its optimizer state and its batches on one device (a GPU or the
  CPU).
* DDP (``train.parallel = "ddp"``): every process holds the whole model; gradients are
  averaged across processes after each backward pass (NCCL on GPUs, gloo on CPUs).
* FSDP2 (``train.parallel = "fsdp"``, ``torch.distributed.fsdp.fully_shard``): every block,
  then the rest of the model, is sharded across processes -- each holds 1/world of the
  parameters, gradients and optimizer moments and gathers a block's full weights only while
  it runs -- for models that do not fit on one device.  Tied weights (embeddings and output
  projection) stay together in the root's shard group.

Checkpoints do not depend on any of this.  A full checkpoint gathers the weights into one
CPU copy (safetensors, like any saved model) and the optimizer moments into one state keyed
by parameter name.  A sharded one (``train.checkpoint_format``, by default whenever the model
is sharded) has every rank write its own shard through torch.distributed.checkpoint
(aiayn/checkpoint/sharded.py), so that nothing is gathered.  Either resumes on a different
number of processes, another device, or with the other strategy (tests/training/test_parallel.py
resumes a 2-process sharded FSDP run on one process and a 1-process run on two).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from aiayn.models import TransformerModel, build_model
from aiayn.nn.blocks import Block


def local_device(device: torch.device, world: int) -> torch.device:
    """Under torchrun, each process takes the GPU numbered by its LOCAL_RANK."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if world > 1 else 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls on Ampere and later
        torch.backends.cudnn.allow_tf32 = True
    return device


def wrap(model: TransformerModel, parallel: str, device: torch.device, world: int) -> nn.Module:
    """The module the training step calls: the model itself, or its DDP / FSDP2 form."""
    if world == 1:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for module in model.modules():
            if isinstance(module, Block):
                fully_shard(module)
        fully_shard(model)
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def is_sharded(model: nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def saveable_model(model: TransformerModel) -> TransformerModel:
    """The model as a full CPU copy to write (a collective call when it is sharded: every
    process must call it; the copy is only complete on rank 0)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        full = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if dist.get_rank() != 0:
            return model
        copy = _cpu_copy(model)
        copy.load_state_dict(full)
        return copy
    if next(model.parameters()).device.type == "cpu":
        return model
    copy = _cpu_copy(model)
    copy.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    return copy


def _cpu_copy(model: TransformerModel) -> TransformerModel:
    """A CPU model of the same config, to load weights into.  Its initialisation draws from
    the CPU RNG: forked, so that a checkpoint or snapshot leaves the run's stream untouched."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        return build_model(model.config)


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state on the CPU, keyed by parameter name (collective when the
    model is sharded; complete on rank 0)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return dict(
            get_optimizer_state_dict(
                model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        )
    sd = optimizer.state_dict()
    order = [p for group in optimizer.param_groups for p in group["params"]]
    names = _names(model)
    by_index = {i: names[id(p)] for i, p in enumerate(order)}

    def cpu(value: Any) -> Any:
        return value.cpu() if isinstance(value, torch.Tensor) else value

    return {
        "state": {
            by_index[i]: {k: cpu(v) for k, v in state.items()} for i, state in sd["state"].items()
        },
        "param_groups": [
            {**group, "params": [by_index[i] for i in group["params"]]}
            for group in sd["param_groups"]
        ],
    }


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Restore what ``optimizer_state`` saved, whatever the process count or strategy."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(
            model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True)
        )
        return
    groups = state["param_groups"]
    if groups and groups[0]["params"] and isinstance(groups[0]["params"][0], int):
        optimizer.load_state_dict(state)  # a checkpoint written before names were used
        return
    order = [p for group in optimizer.param_groups for p in group["params"]]
    names = _names(model)
    index = {names[id(p)]: i for i, p in enumerate(order)}
    optimizer.load_state_dict(
        {
            "state": {index[name]: s for name, s in state["state"].items()},
            "param_groups": [
                {**group, "params": [index[n] for n in group["params"]]} for group in groups
            ],
        }
    )
