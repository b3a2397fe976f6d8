"""Activation functions named as `config.json` names them (`hidden_act`, `activation_function`).

Each one is written as the formula the checkpoint was trained with. Where two formulas are mathematically
equal but round differently (the tanh GELU in Python against torch's fused kernel), we keep the one the
name stands for, so our numbers match transformers bit for bit.
"""

import math

import torch
import torch.nn.functional as F


def gelu(x):
    """Exact GELU, x * Phi(x), with Phi the standard normal CDF (BERT)."""
    return F.gelu(x)


def gelu_new(x):
    """The tanh approximation of GELU from the original BERT and GPT-2 code, written out term by term."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_pytorch_tanh(x):
    """The same tanh approximation as `gelu_new`, computed by torch's fused kernel."""
    return F.gelu(x, approximate="tanh")


def gelu_fast(x):
    """The tanh approximation again, with the constant sqrt(2/pi) rounded as the old code had it."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def quick_gelu(x):
    """x * sigmoid(1.702 x), the cheap GELU of some older checkpoints."""
    return x * torch.sigmoid(1.702 * x)


def relu2(x):
    """ReLU squared (So et al., 2021, Primer): relu(x)²."""
    return torch.square(F.relu(x))


ACTIVATIONS = {
    "gelu": gelu,
    "gelu_new": gelu_new,
    "gelu_pytorch_tanh": gelu_pytorch_tanh,
    "gelu_fast": gelu_fast,
    "quick_gelu": quick_gelu,
    "relu": F.relu,
    "relu2": relu2,
    "relu6": F.relu6,
    "leaky_relu": F.leaky_relu,  # torch's default slope 0.01, as transformers' nn.LeakyReLU()
    "mish": F.mish,  # x tanh(softplus(x)), torch's kernel as transformers calls it
    "hardswish": F.hardswish,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def get_activation(name: str, field: str):
    """The activation called `name` in config field `field`; an unknown name is a ValueError."""
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"config field {field}={name!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}"
        ) from None
