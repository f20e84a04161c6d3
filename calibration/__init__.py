"""Deprecated name of `gpuest.calibrate` (kept one release): `calibration.X` modules are gpuest's."""
from gpuest.calibrate import *  # noqa: F401,F403
from gpuest._alias import install_alias

install_alias("calibration", "gpuest.calibrate", {"calibration.validation_set": "gpuest.evaluate.validation_set"})
