"""Built-in models that are in neither torchvision, timm nor transformers: recurrent language models."""
from __future__ import annotations

import torch
from torch import nn

DEFAULT_VOCAB = 10000
DEFAULT_HIDDEN = 512
DEFAULT_LAYERS = 2
DEFAULT_SEQ = 64


class RecurrentLM(nn.Module):
    """Token embedding -> multi-layer LSTM/GRU (batch_first) -> linear head over the vocabulary."""

    def __init__(self, cell: str = "lstm", vocab_size: int = DEFAULT_VOCAB, hidden_size: int = DEFAULT_HIDDEN,
                 num_layers: int = DEFAULT_LAYERS, dropout: float = 0.0) -> None:
        super().__init__()
        rnn_cls = {"lstm": nn.LSTM, "gru": nn.GRU}.get(cell)
        if rnn_cls is None:
            raise ValueError(f"unknown recurrent cell {cell!r}; accepted: lstm, gru")
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.rnn = rnn_cls(hidden_size, hidden_size, num_layers=num_layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embedding(input_ids))
        return self.head(hidden)


ZOO = {
    "lstm": lambda: RecurrentLM("lstm"),
    "gru": lambda: RecurrentLM("gru"),
}
