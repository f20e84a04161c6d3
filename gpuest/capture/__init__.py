"""Capture: trace PyTorch models into annotated ATen graphs on fake tensors."""
from .trace import GRAPH_SCHEMA, MODES, OPTIMIZERS, PRECISIONS, default_loss, trace, unsupported_ops

__all__ = ["GRAPH_SCHEMA", "MODES", "OPTIMIZERS", "PRECISIONS", "default_loss", "trace", "unsupported_ops"]
