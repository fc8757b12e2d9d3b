"""Multi-head attention (the book's chapter 11) as a Gluon block: scaled dot-product
attention over ``num_heads`` learned projections, keys past each valid length masked out.
Composed from Dense layers and registry ops, so it hybridizes and trains like any layer."""
from __future__ import annotations

import math

from compiler.ops import composite as _c
from compiler.ops import composite_nn as _c_nn

from ..ndarray import F
from .block import HybridBlock
from .layers import Dense, Dropout

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(HybridBlock):
    """``forward(queries, keys, values, valid_lens=None)`` on (batch, n, features) inputs
    gives (batch, num_queries, num_hiddens). ``valid_lens`` is (batch,) or (batch,
    num_queries): the number of keys each query may attend to. As the book's
    ``MultiHeadAttention``: W_q, W_k, W_v and W_o are Dense layers of ``num_hiddens`` units
    (no bias by default), each head attends with dot products scaled by 1/sqrt(head size),
    and ``dropout`` applies to the attention weights while training."""

    def __init__(self, num_hiddens: int, num_heads: int, dropout: float = 0.0,
                 use_bias: bool = False, **kwargs):
        super().__init__(**kwargs)
        if num_hiddens % num_heads:
            raise ValueError(f"MultiHeadAttention: num_hiddens ({num_hiddens}) must be a "
                             f"multiple of num_heads ({num_heads})")
        self.num_heads = int(num_heads)
        self.W_q = Dense(num_hiddens, use_bias=use_bias, flatten=False)
        self.W_k = Dense(num_hiddens, use_bias=use_bias, flatten=False)
        self.W_v = Dense(num_hiddens, use_bias=use_bias, flatten=False)
        self.W_o = Dense(num_hiddens, use_bias=use_bias, flatten=False)
        self.dropout = Dropout(dropout)

    def _split_heads(self, x):
        """(batch, n, hiddens) -> (batch * heads, n, hiddens / heads)."""
        b, n, h = x.shape
        x = F.reshape(x, shape=(b, n, self.num_heads, h // self.num_heads))
        x = F.transpose(x, axes=(0, 2, 1, 3))
        return F.reshape(x, shape=(b * self.num_heads, n, h // self.num_heads))

    def _merge_heads(self, x):
        bh, n, d = x.shape
        x = F.reshape(x, shape=(bh // self.num_heads, self.num_heads, n, d))
        return F.reshape(F.transpose(x, axes=(0, 2, 1, 3)),
                         shape=(bh // self.num_heads, n, self.num_heads * d))

    def forward(self, queries, keys, values, valid_lens=None):
        q = self._split_heads(self.W_q(queries))
        k = self._split_heads(self.W_k(keys))
        v = self._split_heads(self.W_v(values))
        if valid_lens is not None:  # the same lengths for every head of a sample
            valid_lens = _c.repeat(F, valid_lens, self.num_heads, axis=0)
        scores = F.div(_c.batch_dot(F, q, k, transpose_b=True), math.sqrt(q.shape[-1]))
        weights = _c_nn.masked_softmax(F, scores, valid_lens)
        out = _c.batch_dot(F, self.dropout(weights), v)
        return self.W_o(self._merge_heads(out))

    def __repr__(self):
        return (f"MultiHeadAttention(num_hiddens={self.W_q._units}, "
                f"num_heads={self.num_heads})")
