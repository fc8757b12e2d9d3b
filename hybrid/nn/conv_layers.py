"""Gluon's convolution and pooling layers over 1, 2 or 3 spatial axes (channels first):
Conv1D, Conv2D, Conv1DTranspose, Conv2DTranspose, Max/AvgPool1D/2D/3D and their global
forms. One class per family, specialized by rank; ``hybrid.npx`` does the work (2-D through
the registry's conv2d and pool2d, other ranks composed from them: compiler/ops/composite_nn.py).
"""
from __future__ import annotations

from compiler.ops.composite_nn import ntuple

from .. import npx
from .block import HybridBlock
from .layers import _dev, _float_input, _opt_act
from .parameter import Parameter

__all__ = ["Conv1D", "Conv2D", "Conv1DTranspose", "Conv2DTranspose", "MaxPool1D", "MaxPool2D",
           "MaxPool3D", "AvgPool1D", "AvgPool2D", "AvgPool3D", "GlobalMaxPool1D",
           "GlobalMaxPool2D", "GlobalMaxPool3D", "GlobalAvgPool1D", "GlobalAvgPool2D",
           "GlobalAvgPool3D"]

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}


def _check_layout(who, layout, nd):
    if layout not in (None, _LAYOUTS[nd]):
        raise ValueError(f"{who}: only layout='{_LAYOUTS[nd]}' is supported, got {layout!r}")


class _Conv(HybridBlock):
    """A convolution of rank ``_ndim``; ``_transpose``: the transposed convolution, whose
    weight is (in_channels, channels / groups, *kernel) as in Gluon."""

    _ndim = 2
    _transpose = False

    def __init__(self, channels, kernel_size, strides, padding, output_padding, dilation,
                 groups, layout, activation, use_bias, weight_initializer, bias_initializer,
                 in_channels, dtype, **kwargs):
        super().__init__(**kwargs)
        who, nd = type(self).__name__, self._ndim
        _check_layout(who, layout, nd)
        if int(channels) <= 0 or int(groups) <= 0 or channels % groups:
            raise ValueError(f"{who}: channels ({channels}) must be a positive multiple of "
                             f"groups ({groups})")
        if in_channels % groups:
            raise ValueError(f"{who}: in_channels ({in_channels}) must be a multiple of "
                             f"groups ({groups})")
        self._channels = int(channels)
        self._kernel = ntuple(kernel_size, nd, "kernel_size", who)
        self._strides = ntuple(strides, nd, "strides", who)
        self._padding = ntuple(padding, nd, "padding", who)
        self._output_padding = ntuple(output_padding, nd, "output_padding", who)
        self._dilation = ntuple(dilation, nd, "dilation", who)
        self._groups = int(groups)
        self.weight = Parameter("weight", shape=self._weight_shape(in_channels), dtype=dtype,
                                init=weight_initializer)
        self.bias = Parameter("bias", shape=(self._channels,), dtype=dtype,
                              init=bias_initializer) if use_bias else None
        self.act = _opt_act(activation)

    def _weight_shape(self, in_channels):
        if self._transpose:
            return (in_channels, self._channels // self._groups) + self._kernel
        return (self._channels, in_channels // self._groups) + self._kernel

    def forward(self, x):
        _float_input(self, x, self.weight)
        who, nd = type(self).__name__, self._ndim
        if len(x.shape) != nd + 2:
            raise ValueError(f"{who} expects {_LAYOUTS[nd]} input ({nd + 2} dimensions), got "
                             f"shape {tuple(x.shape)}")
        c = x.shape[1]
        if c % self._groups:
            raise ValueError(f"{who}: the input has {c} channels, not a multiple of "
                             f"groups={self._groups}")
        self.weight._finish_deferred_init(self._weight_shape(c))
        dev = _dev(x)
        bias = self.bias.data(dev) if self.bias is not None else None
        kw = dict(stride=self._strides, dilate=self._dilation, pad=self._padding,
                  num_group=self._groups, no_bias=bias is None)
        if self._transpose:
            out = npx.deconvolution(x, self.weight.data(dev), bias, adj=self._output_padding,
                                    **kw)
        else:
            out = npx.convolution(x, self.weight.data(dev), bias, **kw)
        return self.act(out) if self.act is not None else out

    def __repr__(self):
        shape = self.weight.shape
        c_in, c_out = (shape[0], shape[1] * self._groups) if self._transpose else \
            (shape[1] * self._groups, shape[0])
        nd = self._ndim
        s = (f"{type(self).__name__}({c_in or None} -> {c_out}, "
             f"kernel_size={self._kernel}, stride={self._strides}")
        if self._padding != (0,) * nd:
            s += f", padding={self._padding}"
        if self._output_padding != (0,) * nd:
            s += f", output_padding={self._output_padding}"
        if self._dilation != (1,) * nd:
            s += f", dilation={self._dilation}"
        if self._groups != 1:
            s += f", groups={self._groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.act is not None:
            s += f", {self.act}"
        return s + ")"


class Conv2D(_Conv):
    """2-D convolution over NCHW input; weight (channels, in_channels / groups, kh, kw)."""

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, dilation=1,
                 groups: int = 1, layout: str = "NCHW", activation=None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer="zeros", in_channels: int = 0,
                 dtype="float32", **kwargs):
        super().__init__(channels, kernel_size, strides, padding, 0, dilation, groups, layout,
                         activation, use_bias, weight_initializer, bias_initializer,
                         in_channels, dtype, **kwargs)


class Conv1D(_Conv):
    """1-D convolution over NCW input; weight (channels, in_channels / groups, k)."""

    _ndim = 1

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, dilation=1,
                 groups: int = 1, layout: str = "NCW", activation=None, use_bias: bool = True,
                 weight_initializer=None, bias_initializer="zeros", in_channels: int = 0,
                 dtype="float32", **kwargs):
        super().__init__(channels, kernel_size, strides, padding, 0, dilation, groups, layout,
                         activation, use_bias, weight_initializer, bias_initializer,
                         in_channels, dtype, **kwargs)


class Conv2DTranspose(_Conv):
    """The transposed 2-D convolution (the gradient of a convolution with respect to its
    input), over NCHW input; weight (in_channels, channels / groups, kh, kw). Each output
    size is (n - 1) * stride - 2 * padding + dilation * (k - 1) + 1 + output_padding."""

    _transpose = True

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, output_padding=0,
                 dilation=1, groups: int = 1, layout: str = "NCHW", activation=None,
                 use_bias: bool = True, weight_initializer=None, bias_initializer="zeros",
                 in_channels: int = 0, dtype="float32", **kwargs):
        super().__init__(channels, kernel_size, strides, padding, output_padding, dilation,
                         groups, layout, activation, use_bias, weight_initializer,
                         bias_initializer, in_channels, dtype, **kwargs)


class Conv1DTranspose(Conv2DTranspose):
    """The transposed 1-D convolution over NCW input; weight (in_channels, channels /
    groups, k)."""

    _ndim = 1

    def __init__(self, channels: int, kernel_size, strides=1, padding=0, output_padding=0,
                 dilation=1, groups: int = 1, layout: str = "NCW", **kwargs):
        super().__init__(channels, kernel_size, strides, padding, output_padding, dilation,
                         groups, layout, **kwargs)


# ------------------------------------------------------------------------ pooling
class _Pool(HybridBlock):
    _pool_type = "max"
    _ndim = 2

    def __init__(self, pool_size=2, strides=None, padding=0, layout=None,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 global_pool: bool = False, **kwargs):
        super().__init__(**kwargs)
        who, nd = type(self).__name__, self._ndim
        _check_layout(who, layout, nd)
        if ceil_mode and not global_pool:
            raise ValueError(f"{who}: ceil_mode=True is not supported; pad the input instead")
        self._size = ntuple(pool_size, nd, "pool_size", who)
        self._strides = self._size if strides is None else ntuple(strides, nd, "strides", who)
        self._padding = ntuple(padding, nd, "padding", who)
        self._global = global_pool
        self._count_include_pad = count_include_pad

    def forward(self, x):
        if len(x.shape) != self._ndim + 2:
            raise ValueError(f"{type(self).__name__} expects {_LAYOUTS[self._ndim]} input "
                             f"({self._ndim + 2} dimensions), got shape {tuple(x.shape)}")
        return npx.pooling(x, kernel=self._size, stride=self._strides, pad=self._padding,
                           pool_type=self._pool_type, global_pool=self._global,
                           count_include_pad=self._count_include_pad)

    def __repr__(self):
        return (f"{type(self).__name__}(size={self._size}, stride={self._strides}, "
                f"padding={self._padding}, ceil_mode={self._global}, "
                f"global_pool={self._global}, pool_type={self._pool_type}, "
                f"layout={_LAYOUTS[self._ndim]})")


class _GlobalPool(_Pool):
    def __init__(self, layout=None, **kwargs):
        nd = self._ndim
        super().__init__((1,) * nd, (1,) * nd, 0, layout, True, True, True, **kwargs)


def _pool_class(name, base, pool_type, nd, doc):
    return type(name, (base,), {"_pool_type": pool_type, "_ndim": nd, "__doc__": doc,
                                "__module__": __name__})


_WINDOW = {"max": "Max pooling over pool_size windows (strides default to pool_size)",
           "avg": "Average pooling over pool_size windows (count_include_pad=True counts "
                  "padding zeros, as MXNet does)"}
_WHOLE = {"max": "Max over each channel's whole extent", "avg": "Mean over each channel's "
          "whole extent"}
for _nd in (1, 2, 3):
    for _kind, _word in (("max", "Max"), ("avg", "Avg")):
        _lay = _LAYOUTS[_nd]
        globals()[f"{_word}Pool{_nd}D"] = _pool_class(
            f"{_word}Pool{_nd}D", _Pool, _kind, _nd, f"{_WINDOW[_kind]}, over {_lay} input.")
        globals()[f"Global{_word}Pool{_nd}D"] = _pool_class(
            f"Global{_word}Pool{_nd}D", _GlobalPool, _kind, _nd,
            f"{_WHOLE[_kind]}: {_lay} -> (N, C{', 1' * _nd}).")
del _nd, _kind, _word, _lay
