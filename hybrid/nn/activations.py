"""Gluon's activation layers beyond ``Activation``: PReLU (a learned slope), ELU, SELU, GELU,
SiLU and Swish. Each is a name over ``hybrid.npx`` (compiler/ops/composite_nn.py composes
them from registry primitives), so they hybridize and differentiate like any layer."""
from __future__ import annotations

from .. import init as _init
from .. import npx
from .block import HybridBlock
from .layers import _dev, _float_input
from .parameter import Parameter

__all__ = ["PReLU", "ELU", "SELU", "GELU", "SiLU", "Swish"]


class PReLU(HybridBlock):
    """x where x > 0, else alpha * x, with alpha learned: one value (``in_channels=1``, the
    default) or one per channel of axis 1."""

    def __init__(self, alpha_initializer=None, in_channels: int = 1, dtype="float32",
                 **kwargs):
        super().__init__(**kwargs)
        self.alpha = Parameter("alpha", shape=(in_channels,), dtype=dtype,
                               init=alpha_initializer or _init.Constant(0.25))

    def forward(self, x):
        _float_input(self, x, self.alpha)
        return npx.leaky_relu(x, self.alpha.data(_dev(x)), act_type="prelu")

    def __repr__(self):
        return f"PReLU(in_channels={self.alpha.shape[0]})"


class _Act(HybridBlock):
    """An activation without parameters, ``npx.leaky_relu``'s ``_act_type``."""

    _act_type = "elu"

    def forward(self, x):
        return npx.leaky_relu(x, act_type=self._act_type)

    def __repr__(self):
        return f"{type(self).__name__}()"


class ELU(HybridBlock):
    """x where x > 0, else alpha * (exp(x) - 1) (Clevert et al.)."""

    def __init__(self, alpha: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self._alpha = float(alpha)

    def forward(self, x):
        return npx.leaky_relu(x, act_type="elu", slope=self._alpha)

    def __repr__(self):
        return f"ELU(alpha={self._alpha})"


class SELU(_Act):
    """scale * ELU(x, alpha) with the self-normalizing constants (Klambauer et al.)."""

    _act_type = "selu"


class GELU(_Act):
    """x * Phi(x), Phi the standard normal CDF (the exact form, with erf)."""

    _act_type = "gelu"


class Swish(HybridBlock):
    """x * sigmoid(beta * x) (Ramachandran et al.); beta = 1 is SiLU."""

    def __init__(self, beta: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self._beta = float(beta)

    def forward(self, x):
        return npx.silu(x, self._beta)

    def __repr__(self):
        return f"{type(self).__name__}(beta={self._beta})"


class SiLU(Swish):
    """x * sigmoid(x)."""

    def __init__(self, **kwargs):
        super().__init__(1.0, **kwargs)

    def __repr__(self):
        return "SiLU()"
