"""Optimizer steps: foreach AdamW and SGD over many tensor counts and sizes (host-paced), and single
foreach calls of their ops over a few multi-tensor launches."""
from __future__ import annotations

from typing import Sequence

import torch

from .base import DTYPES, Benchmark, Built, TraceSpec, _d, _est, _gen, _randn
from .shape_tables import shape_table


class _Params(torch.nn.Module):
    """Parameters of given shapes on the meta device: only their shapes matter to the trace."""

    def __init__(self, shapes: Sequence[tuple[int, ...]]) -> None:
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.empty(s, device="meta")) for s in shapes])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(p.sum() for p in self.ps) * x


OPTIMIZER_FACTORIES = {
    # Must match gpuest.capture.trace.OPTIMIZERS so the traced step is the timed step.
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True),
}


def _optimizer(out: list[Benchmark]) -> None:
    for opt_name, states in (("adamw", 4), ("sgd", 3)):
        for count, size in shape_table("optimizer", "steps", "steps_more"):
            if opt_name == "sgd" and count in (1000, 150):
                continue
            nb = count * size * 4.0 * (2 * states - 1)

            def build(device: torch.device, seed: int, opt_name=opt_name, count=count, size=size) -> Built:
                c, s = (_d(count, device, 12), _d(size, device, 64))

                def make_set(i: int) -> tuple:
                    params = [torch.zeros(s, device=device, requires_grad=True) for _ in range(c)]
                    g = _gen(device, seed, i)
                    for p in params:
                        p.grad = torch.randn(s, device=device, generator=g)
                    opt = OPTIMIZER_FACTORIES[opt_name](params)
                    opt.step()  # creates the state: the timed steps are steady-state ones
                    return (opt,)
                spec = TraceSpec(_Params([(s,)] * c), (torch.ones((), device="meta"),), mode="training",
                                 optimizer=opt_name, phases=("optimizer",))
                return Built(lambda opt: opt.step(), make_set, spec,
                             bytes_per_set=int(c * s * 4 * states))
            out.append(Benchmark(f"optim_{opt_name}_foreach_{count}x{size}", "optimizer",
                                 {"op": opt_name, "foreach": True, "dtype": "fp32", "tensors": count, "numel": size},
                                 build, est_ms=_est(0, nb) + 0.01 * count * 8 / 30,
                                 trace_cost_s=0.05 + count * 0.006, host_paced=True))


# The foreach call each walk benchmark times (AdamW's addcdiv_ takes a list of step sizes, as its
# non-capturable path does; add_ is SGD's, lerp_ and sqrt AdamW's moment updates), and how many tensor
# lists it reads: in-place ops write their first list.
FOREACH_WALK_CALLS = {
    "addcdiv": (3, lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [-1e-3] * len(a))),
    "add": (2, lambda a, b: torch._foreach_add_(a, b, alpha=0.1)),
    "lerp": (2, lambda a, b: torch._foreach_lerp_(a, b, 0.1)),
    "sqrt": (1, torch._foreach_sqrt),
}


def _foreach_walks(out: list[Benchmark]) -> None:
    for op, count, size, dtype in shape_table("optimizer", "foreach_walks"):
        lists, call = FOREACH_WALK_CALLS[op]
        tdtype = DTYPES[dtype]

        def build(device: torch.device, seed: int, lists=lists, call=call, count=count, size=size,
                  tdtype=tdtype) -> Built:
            c, s = _d(count, device, 12), _d(size, device, 64)

            def make_set(i: int) -> tuple:
                return tuple([_randn((s,), tdtype, device, seed, (i * 8 + k) * 1000 + j) for j in range(c)]
                             for k in range(lists))
            return Built(call, make_set)
        nb = count * size * tdtype.itemsize * (lists + 1)
        tag = "" if dtype == "fp32" else f"_{dtype}"
        out.append(Benchmark(f"foreach_walk_{op}_{count}x{size}{tag}", "optimizer",
                             {"op": f"foreach_{op}", "tensors": count, "numel": size, "dtype": dtype},
                             build, est_ms=_est(0, nb) + 0.02, trace_cost_s=0.05 + count * 0.002))
