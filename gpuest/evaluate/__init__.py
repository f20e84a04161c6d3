"""Evaluation: which measured configs count, what gpuest predicts for them, and how far off it is
(rendered by gpuest.report)."""
