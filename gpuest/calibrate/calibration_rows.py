"""What every fit reads off a calibration row: the nodes that ran on the device and the clock they ran at."""
from __future__ import annotations

from typing import Any

from gpuest.catalog import GPUSpec
from gpuest.price.power import HW_SLOWDOWN_FLOOR

# A row's clock inferred from its measured time and the board's power limit, where the data measured none
# (fit.with_power_capped_clocks); derived in memory at fit time, never stored.
POWER_CAPPED_CLOCK_KEY = "power_capped_clock_mhz"


def device_nodes(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes of a calibration row that run on the device (not free, not host-only)."""
    return [n for n in row["nodes"] if not n.get("free") and not n.get("host_only")]


def row_clock(row: dict[str, Any], gpu: GPUSpec) -> float:
    """The SM clock (MHz) a calibration row ran at, if it is one `gpu` supports: measured, else inferred from its
    time and power limit (POWER_CAPPED_CLOCK_KEY, for data that measured no clock); else its maximum."""
    for key, lowest in (("sm_clock_mhz", gpu.min_clock_mhz),
                        (POWER_CAPPED_CLOCK_KEY, gpu.min_clock_mhz * HW_SLOWDOWN_FLOOR)):
        clock = row.get(key)
        if isinstance(clock, (int, float)) and lowest <= clock <= gpu.max_clock_mhz:
            return float(clock)
    return gpu.max_clock_mhz
