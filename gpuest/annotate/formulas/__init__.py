"""Cost formulas for ATen ops by family, each module registering its own into `registry.REGISTRY`.

FLOP counts for matmul, convolution and attention are torch's own
(`torch.utils.flop_counter.flop_registry`), so they agree with `FlopCounterMode`; the formulas add the
traffic, the implicit GEMM shape and the categories torch does not give, and price everything torch does
not count (elementwise, reductions, norms, pooling, embeddings, copies, foreach optimizer ops, RNN layers,
mixture-of-experts routing). A multiply-add counts 2 FLOPs. Importing this package registers them all.
"""
from . import (  # noqa: F401  (each module registers its formulas)
    matmul, conv, attention, rnn, norm, reduce, pool, embedding, memory, elementwise, optimizer, moe,
)
