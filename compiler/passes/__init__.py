"""Compiler passes: each a pure function Graph -> (Graph, report)."""
from .fusion import fuse
from .memory import check_plan, plan_memory
from .schedule import schedule
from .simplify import simplify

__all__ = ["simplify", "fuse", "schedule", "plan_memory", "check_plan"]
