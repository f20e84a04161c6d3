"""Memory: peak device memory of a traced step, whether it fits a GPU, and the largest batch that does."""
from .max_batch import MaxBatch, max_batch
from .peak import MemoryEstimate, memory_estimate

__all__ = ["MaxBatch", "MemoryEstimate", "max_batch", "memory_estimate"]
