"""Gluon's GroupNorm and InstanceNorm: per-sample normalization over channel groups (all
channels in one group: each sample as a whole; one channel per group: InstanceNorm), then a
per-channel scale and shift. Composed from registry primitives (composite_nn.group_norm)."""
from __future__ import annotations

from compiler.ops import composite_nn as _c_nn

from ..ndarray import F
from .block import HybridBlock
from .layers import _float_input, _scale_shift_ready, scale_shift_params

__all__ = ["GroupNorm", "InstanceNorm"]


class _GroupNorm(HybridBlock):
    def __init__(self, epsilon, center, scale, beta_initializer, gamma_initializer,
                 in_channels, dtype, **kwargs):
        super().__init__(**kwargs)
        self._eps = float(epsilon)
        scale_shift_params(self, in_channels, center, scale, beta_initializer,
                           gamma_initializer, dtype)

    def _groups(self, channels):
        raise NotImplementedError(f"{type(self).__name__} must implement _groups(channels): "
                                  "how many groups its channels split into")

    def forward(self, x):
        _float_input(self, x, self.gamma)
        if len(x.shape) < 2:
            raise ValueError(f"{type(self).__name__} expects (N, C, ...) input, got shape "
                             f"{tuple(x.shape)}")
        groups = self._groups(x.shape[1])
        dev = _scale_shift_ready(self, x, x.shape[1])
        return _c_nn.group_norm(F, x, self.gamma.data(dev), self.beta.data(dev), groups,
                                self._eps)


class GroupNorm(_GroupNorm):
    """Group normalization (Wu and He) of (N, C, ...) input: C splits into ``num_groups``
    groups, each normalized over its channels and positions; gamma and beta are per channel
    (as in Gluon 2 and PyTorch)."""

    def __init__(self, num_groups: int = 1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = True, beta_initializer="zeros", gamma_initializer="ones",
                 in_channels: int = 0, dtype="float32", **kwargs):
        super().__init__(epsilon, center, scale, beta_initializer, gamma_initializer,
                         in_channels, dtype, **kwargs)
        if int(num_groups) <= 0:
            raise ValueError(f"GroupNorm: num_groups must be a positive int, got {num_groups}")
        self._num_groups = int(num_groups)

    def _groups(self, channels):
        if channels % self._num_groups:
            raise ValueError(f"GroupNorm: {channels} channels do not split into "
                             f"{self._num_groups} groups")
        return self._num_groups

    def __repr__(self):
        return (f"GroupNorm(num_groups={self._num_groups}, eps={self._eps}, "
                f"in_channels={self.gamma.shape[0] or None})")


class InstanceNorm(_GroupNorm):
    """Instance normalization (Ulyanov et al.) of (N, C, ...) input: each channel of each
    sample normalized over its positions, then scaled and shifted per channel."""

    def __init__(self, axis: int = 1, epsilon: float = 1e-5, center: bool = True,
                 scale: bool = False, beta_initializer="zeros", gamma_initializer="ones",
                 in_channels: int = 0, dtype="float32", **kwargs):
        if axis != 1:
            raise ValueError(f"InstanceNorm: only axis=1 (channels first) is supported, got "
                             f"{axis}")
        super().__init__(epsilon, center, scale, beta_initializer, gamma_initializer,
                         in_channels, dtype, **kwargs)

    def _groups(self, channels):
        return channels

    def __repr__(self):
        return f"InstanceNorm(eps={self._eps}, in_channels={self.gamma.shape[0] or None})"
