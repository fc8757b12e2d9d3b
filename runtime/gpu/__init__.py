"""The GPU seam: what a GPU does, behind one small interface (seam.py).

Two implementations: ``cupy_gpu.py`` (a real NVIDIA GPU through CuPy) and ``emulated.py``
(``HYBRID_GPU_EMULATE=N``: N GPUs on the CPU, whose kernels run through ``emu/``). Everything
above the runtime reaches GPUs through :class:`runtime.device.Device`, which asks
:func:`seam.get_gpu`; nothing imports CuPy but ``cupy_gpu.py``.
"""
from .seam import GPU, GPUError, get_gpu, implementation, num_gpus

__all__ = ["GPU", "GPUError", "get_gpu", "implementation", "num_gpus"]
