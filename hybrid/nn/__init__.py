"""Gluon's neural-network API: blocks, parameters and layers (``from hybrid import nn``).

    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(10))
    net.initialize(init.Xavier())
    net.hybridize()
"""
from .block import (Block, Concatenate, HybridBlock, HybridConcatenate, HybridLambda,
                    HybridSequential, Identity, Lambda, Sequential)
from .layers import (Activation, BatchNorm, Dense, Dropout, Embedding, Flatten, LayerNorm,
                     LeakyReLU)
from .conv_layers import (AvgPool1D, AvgPool2D, AvgPool3D, Conv1D, Conv1DTranspose, Conv2D,
                          Conv2DTranspose, GlobalAvgPool1D, GlobalAvgPool2D, GlobalAvgPool3D,
                          GlobalMaxPool1D, GlobalMaxPool2D, GlobalMaxPool3D, MaxPool1D,
                          MaxPool2D, MaxPool3D)
from .activations import ELU, GELU, PReLU, SELU, SiLU, Swish
from .norm_layers import GroupNorm, InstanceNorm
from .attention import MultiHeadAttention
from .parameter import Constant, DeferredInitializationError, Parameter, ParameterDict
from . import models

__all__ = ["Block", "HybridBlock", "Sequential", "HybridSequential", "Concatenate",
           "HybridConcatenate", "Lambda", "HybridLambda", "Identity", "Dense", "Conv1D",
           "Conv2D", "Conv1DTranspose", "Conv2DTranspose", "MaxPool1D", "MaxPool2D",
           "MaxPool3D", "AvgPool1D", "AvgPool2D", "AvgPool3D", "GlobalMaxPool1D",
           "GlobalMaxPool2D", "GlobalMaxPool3D", "GlobalAvgPool1D", "GlobalAvgPool2D",
           "GlobalAvgPool3D", "BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "Dropout",
           "Flatten", "Activation", "LeakyReLU", "PReLU", "ELU", "SELU", "GELU", "SiLU",
           "Swish", "Embedding", "MultiHeadAttention", "Parameter", "Constant",
           "ParameterDict", "DeferredInitializationError", "models"]
