"""Gluon's neural-network API: blocks, parameters and layers (``from hybrid import nn``).

    net = nn.HybridSequential()
    net.add(nn.Dense(256, activation="relu"), nn.Dense(10))
    net.initialize(init.Xavier())
    net.hybridize()
"""
from .block import (Block, HybridBlock, HybridLambda, HybridSequential, Identity, Lambda,
                    Sequential)
from .layers import (Activation, AvgPool2D, BatchNorm, Conv2D, Dense, Dropout, Embedding,
                     Flatten, GlobalAvgPool2D, GlobalMaxPool2D, LayerNorm, LeakyReLU, MaxPool2D)
from .parameter import Constant, DeferredInitializationError, Parameter, ParameterDict
from . import models

__all__ = ["Block", "HybridBlock", "Sequential", "HybridSequential", "Lambda", "HybridLambda",
           "Identity", "Dense", "Conv2D", "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D",
           "GlobalMaxPool2D", "BatchNorm", "LayerNorm", "Dropout", "Flatten", "Activation",
           "LeakyReLU", "Embedding", "Parameter", "Constant", "ParameterDict",
           "DeferredInitializationError", "models"]
