"""The few torch.distributed operations the training loop needs.

One process needs no launcher. Under ``torchrun --nproc-per-node N -m rdpp_cli ...`` (which sets
``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) ``setup`` joins the process
group: NCCL when training on CUDA (process ``LOCAL_RANK`` uses GPU ``LOCAL_RANK``), gloo on CPU.
Every helper here is a no-op with one process. Beside them: how a step function reaches the model
through DDP's wrapper (``call``, ``unwrap``) and the output folder claimed on rank 0 (``claim_output``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from rdpp_cli.artifacts import prepare_output
from rdpp_cli.device import resolve_device
from rdpp_cli.errors import RdppError

T = TypeVar("T")


@dataclass(frozen=True)
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


_runtime: Runtime | None = None


def setup(device: str | torch.device = "auto") -> Runtime:
    """The process's rank, world size and device; joins the process group under torchrun.

    Idempotent: a second call returns the first call's runtime.
    """
    global _runtime
    if _runtime is not None:
        return _runtime
    dev = resolve_device(device)
    world = _env_int("WORLD_SIZE", "1")
    if world <= 1:
        _runtime = Runtime(0, 1, 0, dev)
        return _runtime
    missing = [v for v in LAUNCHER_ENV if not os.environ.get(v)]
    if missing:
        raise RdppError(f"WORLD_SIZE is {world} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                        "set: start several processes with `torchrun --nproc-per-node N -m rdpp_cli ...`, which sets "
                        "them all (or unset WORLD_SIZE for one process)")
    local_rank = _env_int("LOCAL_RANK", "0")
    if dev.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RdppError(f"process {local_rank} of torchrun has no GPU ({torch.cuda.device_count()} visible); "
                            "use --nproc-per-node at most the number of GPUs")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        try:
            dist.init_process_group(backend=backend)
        except (RuntimeError, ValueError) as e:  # rendezvous timeout, port taken, backend missing, ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise RdppError(f"process {os.environ['RANK']} could not join the {world} torchrun processes ({backend} at "
                            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}: {first}); check that every "
                            "process was started by the same torchrun and that the port is free") from None
    _runtime = Runtime(dist.get_rank(), dist.get_world_size(), local_rank, dev)
    return _runtime


LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets beside WORLD_SIZE


def _env_int(name: str, default: str) -> int:
    value = os.environ.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise RdppError(f"{name} is {value!r}, not a whole number: torchrun sets it; start several processes with "
                        "`torchrun --nproc-per-node N -m rdpp_cli ...`") from None


def runtime() -> Runtime:
    """The runtime set up by ``setup`` (one CPU process when nobody called it)."""
    return _runtime if _runtime is not None else Runtime(0, 1, 0, torch.device("cpu"))


def teardown() -> None:
    global _runtime
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _runtime = None


def barrier() -> None:
    if runtime().distributed:
        dist.barrier()


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank."""
    if not runtime().distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    rt = runtime()
    if not rt.distributed:
        return [obj]
    out: list[Any] = [None] * rt.world_size
    dist.all_gather_object(out, obj)
    return out


def any_true(flag: bool) -> bool:
    """Whether ``flag`` is true on any process (one tiny all-reduce; no-op with one process)."""
    rt = runtime()
    if not rt.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=rt.device if rt.device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def per_process_share(count: torch.Tensor) -> torch.Tensor:
    """``count`` summed over the processes and divided by their number.

    A loss ``Σ_local / per_process_share(N_local)`` makes DDP's average of the processes' gradients
    equal to the gradient of ``Σ_all / N_all``, the loss of one process over the whole step: exact
    also when the processes hold different numbers of tokens. One small all-reduce per call; with
    one process ``count`` itself.
    """
    rt = runtime()
    if not rt.distributed:
        return count
    t = count.detach().to(torch.float64).clone()
    dist.all_reduce(t)
    return (t / rt.world_size).to(count.dtype)


def on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and give its result to every rank; an RdppError it raises is
    raised on every rank (so no rank waits forever for a failed one)."""
    if not runtime().distributed:
        return fn()
    result: tuple[str, Any] = ("ok", None)
    if runtime().is_main:
        try:
            result = ("ok", fn())
        except RdppError as e:
            result = ("error", str(e))
    kind, value = broadcast_object(result)
    if kind == "error":
        raise RdppError(value)
    return value


def _run(model: nn.Module, method, *args, **kwargs):
    """``model.<method>(...)``, or ``method(model, ...)`` for a function of the model."""
    return method(model, *args, **kwargs) if callable(method) else getattr(model, method)(*args, **kwargs)


class DDPMethods(nn.Module):
    """What DDP wraps: its forward runs any method of the model (or a function of it). DDP
    synchronises gradients only of what runs through its forward, so ``call(net, "token_logprobs",
    ...)`` goes through here."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, method="forward", **kwargs):
        return _run(self.model, method, *args, **kwargs)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside the DistributedDataParallel wrapper (or the model itself)."""
    inner = getattr(model, "module", model)
    return inner.model if isinstance(inner, DDPMethods) else inner


def call(net: nn.Module, method, *args, **kwargs):
    """``net.<method>(*args, **kwargs)`` for the model a step function gets, DDP-wrapped or not
    (e.g. ``call(net, "token_logprobs", att, seqs)``); ``method`` may also be a function called as
    ``method(model, *args, **kwargs)``. Gradients are synchronised under DDP."""
    if isinstance(net, nn.parallel.DistributedDataParallel):
        return net(*args, method=method, **kwargs)
    return _run(net, method, *args, **kwargs)


def claim_output(out: Path | str | None, **kwargs) -> Path:
    """``artifacts.prepare_output`` on rank 0 only; every process gets the folder (or its error)."""
    return Path(on_main(lambda: str(prepare_output(out, **kwargs))))
