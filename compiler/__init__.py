"""hybrid's compiler: the op registry, the graph IR, autodiff, passes and code generation.

Never imports ``hybrid`` (layers point down: hybrid -> compiler -> runtime).
"""
