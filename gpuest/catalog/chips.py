"""What a board's chip draws flat out: each chip's full-load reference (chips.json) and the unlimited
full-load power of a board built on it.

A board's TDP is the limit its power delivery enforces, not what its chip draws: a T4 (70 W) runs the TU104 of a
250 W RTX 2080 SUPER, an A10 (150 W) the GA102 of a 450 W RTX 3090 Ti. Power models move between GPUs by this
full-load power (price.power.transfer_power), and the board's limit then throttles what exceeds it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuest.errors import CatalogError

from .gpu_spec import GPUSpec, get_gpu

CHIPS_FILE = Path(__file__).resolve().parent / "chips.json"
REFERENCE_FIELDS = ("board", "sm_count", "max_clock_mhz", "tdp_w", "source")


@dataclass(frozen=True)
class ChipReference:
    """The board whose TDP a chip's design fills: its SM count, max clock (MHz) and TDP (W)."""
    chip: str
    board: str
    sm_count: int
    max_clock_mhz: float
    tdp_w: float


def _reference(chip: str, entry: Any) -> ChipReference:
    """The ChipReference of one chips.json entry: a catalogue GPU's name, or the reference board's own facts."""
    ref = entry.get("reference") if isinstance(entry, dict) else None
    if isinstance(ref, str):
        spec = get_gpu(ref)
        return ChipReference(chip, spec.name, spec.sm_count, spec.max_clock_mhz, spec.tdp_w)
    if not isinstance(ref, dict) or any(k not in ref for k in REFERENCE_FIELDS):
        raise CatalogError(f"{CHIPS_FILE}: chip {chip!r}: 'reference' must name a catalogue GPU or give "
                           f"{', '.join(REFERENCE_FIELDS)}; got {ref!r}")
    if not all(isinstance(ref[k], (int, float)) and ref[k] > 0 for k in ("sm_count", "max_clock_mhz", "tdp_w")):
        raise CatalogError(f"{CHIPS_FILE}: chip {chip!r}: sm_count, max_clock_mhz and tdp_w must be numbers > 0")
    return ChipReference(chip, str(ref["board"]), int(ref["sm_count"]), float(ref["max_clock_mhz"]),
                         float(ref["tdp_w"]))


@lru_cache(maxsize=1)
def chip_references() -> dict[str, ChipReference]:
    """Every chip of chips.json with its full-load reference board."""
    try:
        data = json.loads(CHIPS_FILE.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CatalogError(f"{CHIPS_FILE}: cannot read the chip references: {e}") from e
    return {chip: _reference(chip, entry) for chip, entry in data["chips"].items()}


def full_load_power_w(gpu: GPUSpec) -> float:
    """Board power (W) `gpu` would draw running its chip flat out at its max clock with no power limit: its
    chip's reference TDP scaled by SM count x max clock (switching power ~ active SMs x f; both run the top of
    the voltage curve, so a board clocked below its reference is overestimated by its lower voltage). A board
    whose chip has no reference (or none given) draws its TDP: its limit is taken to be its full load."""
    ref = chip_references().get(gpu.chip) if gpu.chip else None
    if ref is None:
        return gpu.tdp_w
    return ref.tdp_w * (gpu.sm_count * gpu.max_clock_mhz) / (ref.sm_count * ref.max_clock_mhz)
