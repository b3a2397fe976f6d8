"""The gated MLP of the Llama-like families and Gemma (Shazeer, 2020, "GLU Variants Improve Transformer"):

    MLP(x) = down( act(gate(x)) * up(x) )          SwiGLU with act = SiLU (Llama, Mistral, Qwen),
                                                   GeGLU with the tanh GELU (Gemma)

The activated gate decides, per neuron, how much of the linear branch `up(x)` passes. The modules keep
transformers' names (gate_proj, up_proj, down_proj), so the mapping tables read the same on both sides.
Shapes: b batch, s tokens, h hidden, m MLP width; an expert of a mixture (parts/moe.py) reads the t tokens routed to
it, [t, h], in place of [b, s, h].
"""

from torch import nn

from .activations import get_activation
from .hook_point import HookPoint


class GatedMLP(nn.Module):
    """h -> m -> h through a gate. `act`: the activation's name as config.json gives it in `act_field`. `tokens`: the
    axes before the last of its hook points ("b, s"; an expert's "t")."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, *, bias: bool = False,
                 act_field: str = "hidden_act", tokens: str = "b, s"):
        super().__init__()
        dense = tokens == "b, s"
        expert = "" if dense else " (the tokens routed to this expert)"
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.pre_act = HookPoint(f"{tokens}, m", f"the gate's pre-activation (gate_proj){expert}"
                                 + ("; TransformerLens' hook_pre" if dense else ""))
        self.act = get_activation(act, act_field)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up = HookPoint(f"{tokens}, m", f"the linear branch (up_proj) the activated gate multiplies{expert}"
                            + ("; TransformerLens' hook_pre_linear" if dense else ""))
        self.post_act = HookPoint(f"{tokens}, m", f"MLP neurons: the activated gate times the linear branch{expert}")
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.proj = HookPoint(f"{tokens}, h", f"the MLP's output (down_proj){expert}")

    def forward(self, x):
        gate = self.act(self.pre_act(self.gate_proj(x)))  # in transformers' order: the gate, then the branch
        return self.proj(self.down_proj(self.post_act(gate * self.up(self.up_proj(x)))))
