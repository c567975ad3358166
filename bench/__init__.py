"""tgcore's benchmark harness: `python -m bench` measures tgcore's devices against numpy, torch and tinygrad.

It prints figures and ratios only; speed goals are never assertions. A result that disagrees with numpy is
reported loudly and makes the run exit non-zero.
"""
