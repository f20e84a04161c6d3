"""Data, no code: the calibration suite's shape tables, shapes/<module>.json for suite/<module>.py, read by
gpuest.calibrate.suite.shape_tables."""
