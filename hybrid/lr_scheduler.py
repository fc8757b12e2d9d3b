"""Learning-rate schedules (``hybrid.lr_scheduler``), MXNet's names.

A scheduler is called with the number of updates done so far and returns the learning rate;
it is stateless, so calling it out of order (to plot a schedule) is fine.

    sched = lr_scheduler.CosineScheduler(max_update=1000, base_lr=0.1, warmup_steps=50)
    trainer = hb.Trainer(net.collect_params(), "sgd", {"lr_scheduler": sched})
"""
from __future__ import annotations

import math

__all__ = ["LRScheduler", "FactorScheduler", "MultiFactorScheduler", "CosineScheduler",
           "PolyScheduler"]


class LRScheduler:
    """Base class: optional warm-up from ``warmup_begin_lr`` to ``base_lr`` over
    ``warmup_steps`` updates ('linear' or 'constant')."""

    def __init__(self, base_lr: float = 0.01, warmup_steps: int = 0,
                 warmup_begin_lr: float = 0.0, warmup_mode: str = "linear"):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if warmup_mode not in ("linear", "constant"):
            raise ValueError(f"warmup_mode must be 'linear' or 'constant', got {warmup_mode!r}")
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.warmup_begin_lr = float(warmup_begin_lr)
        self.warmup_final_lr = float(base_lr)
        self.warmup_mode = warmup_mode

    def get_warmup_lr(self, num_update: int) -> float:
        if self.warmup_mode == "constant":
            return self.warmup_begin_lr
        frac = num_update / max(self.warmup_steps, 1)
        return self.warmup_begin_lr + (self.base_lr - self.warmup_begin_lr) * frac

    def __call__(self, num_update: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(num_update)")

    def __repr__(self):
        keys = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({keys})"


class FactorScheduler(LRScheduler):
    """lr = base_lr * factor ** floor((num_update - 1) / step), never below stop_factor_lr
    (MXNet's FactorScheduler: the rate drops once every ``step`` updates)."""

    def __init__(self, step: int, factor: float = 1.0, stop_factor_lr: float = 1e-8,
                 base_lr: float = 0.01, warmup_steps: int = 0, warmup_begin_lr: float = 0.0,
                 warmup_mode: str = "linear"):
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        if step < 1:
            raise ValueError(f"FactorScheduler: step must be >= 1, got {step}")
        if factor > 1.0:
            raise ValueError(f"FactorScheduler: factor must be <= 1 to decay, got {factor}")
        self.step = int(step)
        self.factor = float(factor)
        self.stop_factor_lr = float(stop_factor_lr)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        k = max(0, (int(num_update) - 1) // self.step)
        return max(self.base_lr * self.factor ** k, self.stop_factor_lr) if k else self.base_lr


class MultiFactorScheduler(LRScheduler):
    """lr = base_lr * factor ** (number of milestones in ``step`` that num_update passed)."""

    def __init__(self, step, factor: float = 1.0, base_lr: float = 0.01,
                 warmup_steps: int = 0, warmup_begin_lr: float = 0.0,
                 warmup_mode: str = "linear"):
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        step = [int(s) for s in step]
        if not step or any(b <= a for a, b in zip(step, step[1:])) or step[0] < 1:
            raise ValueError(f"MultiFactorScheduler: step must be an increasing list of "
                             f"positive ints, got {step}")
        self.step = step
        self.factor = float(factor)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        k = sum(1 for s in self.step if num_update > s)
        return self.base_lr * self.factor ** k


class _DecayScheduler(LRScheduler):
    """From base_lr down to final_lr over ``max_update`` updates (after warm-up), along
    ``_shape(fraction done)`` going from 1 to 0."""

    def __init__(self, max_update: int, base_lr: float, final_lr: float, warmup_steps: int,
                 warmup_begin_lr: float, warmup_mode: str):
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        if max_update < 1 or warmup_steps >= max_update:
            raise ValueError(f"{type(self).__name__}: need max_update ({max_update}) >= 1 and "
                             f"greater than warmup_steps ({warmup_steps})")
        self.max_update = int(max_update)
        self.final_lr = float(final_lr)

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        if num_update <= self.max_update:
            frac = (num_update - self.warmup_steps) / (self.max_update - self.warmup_steps)
            return self.final_lr + (self.base_lr - self.final_lr) * self._shape(frac)
        return self.final_lr


class CosineScheduler(_DecayScheduler):
    """Cosine decay from base_lr to final_lr over ``max_update`` updates (after warm-up)."""

    def __init__(self, max_update: int, base_lr: float = 0.01, final_lr: float = 0.0,
                 warmup_steps: int = 0, warmup_begin_lr: float = 0.0,
                 warmup_mode: str = "linear"):
        super().__init__(max_update, base_lr, final_lr, warmup_steps, warmup_begin_lr,
                         warmup_mode)

    @staticmethod
    def _shape(frac):
        return (1 + math.cos(math.pi * frac)) / 2


class PolyScheduler(_DecayScheduler):
    """Polynomial decay: final_lr + (base_lr - final_lr) * (1 - t / T) ** pwr."""

    def __init__(self, max_update: int, base_lr: float = 0.01, pwr: float = 2,
                 final_lr: float = 0.0, warmup_steps: int = 0, warmup_begin_lr: float = 0.0,
                 warmup_mode: str = "linear"):
        super().__init__(max_update, base_lr, final_lr, warmup_steps, warmup_begin_lr,
                         warmup_mode)
        self.power = float(pwr)

    def _shape(self, frac):
        return (1 - frac) ** self.power
