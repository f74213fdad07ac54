"""One process or many (torchrun): the process group, the device, and a sampler that makes both agree.

Launched by ``torchrun --nproc-per-node N``, every process reads RANK / WORLD_SIZE / LOCAL_RANK from the
environment, joins a process group (NCCL on GPUs, Gloo on CPUs) and trains on its slice of every global
mini-batch. :class:`GlobalBatchSampler` draws one permutation per epoch from the seed and cuts it into global
batches of ``batch_size``; process r takes the r-th of ``world`` equal slices of each. Averaged by DDP, the
gradient equals the single-process gradient of the same global batch, so the same command gives the same
training on one process or many (up to the order of floating-point sums).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..data.resident import batch_count, batch_parts, epoch_order
from ..errors import ConfigError


@dataclass(frozen=True)
class Context:
    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def uses_cuda(device_choice: str) -> bool:
    """Whether a run with ``run.device=device_choice`` trains on CUDA (``auto``: when torch sees a device);
    ConfigError when it asks for CUDA and there is none - checked before a run writes anything."""
    if device_choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device=cuda, but torch sees no CUDA device on this machine; "
                          "use --set run.device=cpu (or auto: CUDA when there is a device)")
    return device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())


def setup(device_choice: str) -> Context:
    """The device and, under torchrun, the process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = uses_cuda(device_choice)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Context(rank, world, device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], ctx: Context) -> list[float]:
    """Sum floats over all processes (float64)."""
    if ctx.world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.tolist()


def broadcast_flag(flag: bool, ctx: Context) -> bool:
    """True on every process when it is true on any."""
    return bool(all_reduce_sum([float(flag)], ctx)[0] > 0)


def barrier(ctx: Context) -> None:
    if ctx.world > 1:
        dist.barrier()


class GlobalBatchSampler(torch.utils.data.Sampler[list[int]]):
    """This process's slice of every global mini-batch; incomplete last batches are dropped when training."""

    def __init__(self, n: int, batch_size: int, ctx: Context, *, shuffle: bool, seed: int, drop_last: bool) -> None:
        if batch_size % ctx.world:
            raise ConfigError(f"data.batch_size={batch_size} is not divisible by the {ctx.world} processes")
        self.n, self.batch_size, self.ctx = n, batch_size, ctx
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.n, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        for _, start, stop, part in batch_parts(self.n, self.batch_size, rank=self.ctx.rank, world=self.ctx.world,
                                                drop_last=self.drop_last):
            yield order[start:stop][part].tolist()

    def __len__(self) -> int:
        return batch_count(self.n, self.batch_size, self.drop_last)
