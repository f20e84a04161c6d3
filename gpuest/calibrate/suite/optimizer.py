"""Optimizer steps: foreach AdamW and SGD over many tensor counts and sizes (host-paced)."""
from __future__ import annotations

from typing import Sequence

import torch

from .base import Benchmark, Built, TraceSpec, _d, _est, _gen
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
