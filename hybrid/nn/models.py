"""The book's models, built from Gluon layers: an MLP, LeNet and the ResNet-18 variant of
section 12.6 (3x3 stride-1 stem, no max-pool). All are HybridBlocks, so they hybridize.

    net = models.lenet(); net.initialize(init.Xavier()); net(hb.zeros((1, 1, 28, 28)))
"""
from __future__ import annotations

from .. import npx
from .block import HybridBlock, HybridSequential
from .conv_layers import AvgPool2D, Conv2D, GlobalAvgPool2D
from .layers import Activation, BatchNorm, Dense

__all__ = ["mlp", "lenet", "Residual", "resnet_block", "resnet18"]


def mlp(hidden=(256,), num_outputs: int = 10, activation: str = "relu") -> HybridSequential:
    """Dense layers of ``hidden`` units with ``activation``, then Dense(num_outputs).

    mlp() is the book's MLP (256 relu -> 10); mlp((256, 128), 2) the one of section 12.1.
    """
    net = HybridSequential()
    for h in (hidden,) if isinstance(hidden, int) else hidden:
        net.add(Dense(h, activation=activation))
    net.add(Dense(num_outputs))
    return net


def lenet(num_outputs: int = 10, activation: str = "sigmoid") -> HybridSequential:
    """LeNet-5 as in the book (sigmoid activations): expects (N, 1, 28, 28) input."""
    net = HybridSequential()
    net.add(Conv2D(channels=6, kernel_size=5, padding=2, activation=activation),
            AvgPool2D(pool_size=2, strides=2),
            Conv2D(channels=16, kernel_size=5, activation=activation),
            AvgPool2D(pool_size=2, strides=2),
            Dense(120, activation=activation),
            Dense(84, activation=activation),
            Dense(num_outputs))
    return net


class Residual(HybridBlock):
    """The book's residual block: two 3x3 convolutions with batch norm, plus the input
    (through a 1x1 convolution when the shape changes)."""

    def __init__(self, num_channels: int, use_1x1conv: bool = False, strides: int = 1,
                 **kwargs):
        super().__init__(**kwargs)
        self.conv1 = Conv2D(num_channels, kernel_size=3, padding=1, strides=strides)
        self.conv2 = Conv2D(num_channels, kernel_size=3, padding=1)
        self.conv3 = Conv2D(num_channels, kernel_size=1, strides=strides) \
            if use_1x1conv else None
        self.bn1 = BatchNorm()
        self.bn2 = BatchNorm()

    def forward(self, x):
        y = npx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return npx.relu(y + x)


def resnet_block(num_channels: int, num_residuals: int, first_block: bool = False):
    blk = HybridSequential()
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blk.add(Residual(num_channels, use_1x1conv=True, strides=2))
        else:
            blk.add(Residual(num_channels))
    return blk


def resnet18(num_classes: int = 10, width: int = 64) -> HybridSequential:
    """The ResNet-18 variant of section 12.6: a 3x3 stride-1 stem without max-pooling, four
    stages of two residual blocks (width, 2*width, 4*width, 8*width channels), global
    average pooling and a Dense classifier. ``width=64`` is the book's; smaller widths make
    quick CPU experiments."""
    net = HybridSequential()
    net.add(Conv2D(width, kernel_size=3, strides=1, padding=1), BatchNorm(),
            Activation("relu"))
    net.add(resnet_block(width, 2, first_block=True), resnet_block(2 * width, 2),
            resnet_block(4 * width, 2), resnet_block(8 * width, 2))
    net.add(GlobalAvgPool2D(), Dense(num_classes))
    return net
