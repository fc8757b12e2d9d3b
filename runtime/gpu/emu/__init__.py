"""The emulated GPU's code path: generated CUDA C compiled by the host C++ compiler under an
emulation header (cuda_emu.h: blocks in turn, each block's threads as fibers, so barriers,
shared memory, warp shuffles and atomics behave as on a GPU), loaded with ctypes (build.py).
The emulated GPU seam (../emulated.py) calls ``build_module`` and ``EmuModule.launch``.
"""
from .build import EmuBuildError, EmuLaunchError, EmuModule, build_module

__all__ = ["EmuBuildError", "EmuLaunchError", "EmuModule", "build_module"]
