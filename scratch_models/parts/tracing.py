"""Whether a graph is being captured (torch.jit.trace, torch.export, torch.compile, torch.fx).

While one is, a Python branch on a tensor's values is taken once, for the example input, and frozen into the
graph for every later input, or it stops the capture outright. Code that branches on values for speed alone
(skip a mask that masks nothing) or for checks (an id out of range) asks this first and then takes the path
that is right for every input.
"""

import torch
from torch._subclasses.fake_tensor import FakeTensor


def is_tracing(tensor: torch.Tensor | None = None) -> bool:
    if torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True
    # torch.export's non-strict mode and torch.fx run the Python code on fake or proxy tensors
    return isinstance(tensor, (FakeTensor, torch.fx.Proxy))
