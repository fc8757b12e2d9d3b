"""The CUDA C target, beside the LLVM CPU target (../llvm/): kernel-IR Programs -> CUDA C
kernels, compiled and launched through the runtime's GPU seam (DESIGN.md, section 2). It
will read the same kernel IR (../kernel.py), scalar builder protocol (../scalar.py) and
extern plans (../extern_plan.py). Nothing lives here yet (issue 21, "One code generator, two
targets").
"""
