"""Memory: peak device memory of a traced step, whether it fits a GPU, and the largest batch that does."""
from .peak import MemoryEstimate, memory_estimate

__all__ = ["MemoryEstimate", "memory_estimate"]
