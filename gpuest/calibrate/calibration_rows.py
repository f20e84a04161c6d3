"""What every fit reads off a calibration row: the nodes that ran on the device and the clock they ran at."""
from __future__ import annotations

from typing import Any

from gpuest.catalog import GPUSpec


def device_nodes(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of a calibration row that run on the device (not free, not host-only)."""
    return [n for n in row["nodes"] if not n.get("free") and not n.get("host_only")]


def row_clock(row: dict[str, Any], gpu: GPUSpec) -> float:
    """The SM clock (MHz) a calibration row ran at, if it is one `gpu` supports; else its maximum."""
    clock = row.get("sm_clock_mhz")
    if isinstance(clock, (int, float)) and gpu.min_clock_mhz <= clock <= gpu.max_clock_mhz:
        return float(clock)
    return gpu.max_clock_mhz
