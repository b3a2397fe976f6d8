"""GPT-OSS (OpenAI, 2025) from the model card's math: Llama's pre-norm stack (scratch_models/llama/model.py) with
attention sinks, sliding-window and full layers in turn, and a mixture of experts in every layer (parts/moe.py):

    each layer:  x = x + Attention(RMSNorm1(x));  x = x + MoE(RMSNorm2(x))
    Attention  = softmax over [q·k / sqrt(d) for the keys it sees, sink_n] (the sink dropped after) · v
                 one learned logit `sinks` per head joins every query's softmax: a key-less place the head may put
                 its weight, so a row of probabilities sums to 1 less the sink's share; q, k, v and o have biases,
                 the rotary angles are YaRN's (parts/rotary.py); a sliding_attention layer sees its last
                 `sliding_window` keys only
    MoE(x)     = Σ over the num_experts_per_tok chosen experts of softmax(their router logits) · expert_e(x)
                 router = x Wᵀ + b, chosen its top k (transformers' order: top-k of the logits, then the softmax of
                 those k)
    expert_e(x): gate, up = the even and odd columns of x @ gate_up_proj[e] + gate_up_proj_bias[e]
                 gate = min(gate, limit);  up = clamp(up, -limit, limit)
                 out  = ((up + 1) · gate · sigmoid(alpha · gate)) @ down_proj[e] + down_proj_bias[e]
    RMSNorm    = x / sqrt(mean(x²) + eps) · w, the product in float32 before the cast (as OLMo 2's)

The experts are kept as the files hold them, one tensor per kind for all experts ([E, h, 2m], [E, m, h]: inputs
first, gate and up interleaved); the released files store gate_up_proj and down_proj in MXFP4, which the model
classes read dequantized exactly as transformers does (weight_mapping/mxfp4.py).

Shapes: b batch, s new tokens, p cached tokens, h hidden, n query heads, d head size, E experts, m expert width, t the
tokens routed to one expert.
"""

import torch
import torch.nn.functional as F
from torch import nn

from weight_mapping.gpt_oss import GPT_OSS
from weight_mapping.mxfp4 import unpacked

from ..decoding.decoder import CausalLM
from ..llama.model import LlamaAttention, LlamaDecoderLayer, LlamaModel
from ..olmo2.model import Olmo2RMSNorm
from ..parts.attention import causal_mask, repeat_kv
from ..parts.hook_point import HookPoint
from ..parts.moe import SparseMoeBlock
from .config import GptOssConfig


class GptOssAttention(LlamaAttention):
    """Llama's attention (grouped key/value heads, rotary angles, biases) plus a sink logit per head in the softmax.
    Always the explicit path: torch's fused kernel has no sinks."""

    def __init__(self, config: GptOssConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.sinks = nn.Parameter(torch.zeros(config.num_attention_heads))  # one logit per query head
        self.probs = HookPoint("b, n, s, p + s", "attention probabilities: each query's weights over the keys, the "
                               "sink's share left out (a row sums to 1 less it; all 0 for a query that sees no key)")

    def scaled_dot_product(self, q, k, v, mask, *, causal: bool, explicit: bool):
        if causal:
            mask = causal_mask(None, q.shape[2], 0, q.device)
        groups = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        s = torch.matmul(q, k.transpose(-1, -2)) * self.head_dim ** -0.5  # [b, n, s, p + s]
        if mask is not None:
            s = s.masked_fill(~mask.keep, torch.finfo(s.dtype).min)
        s = self.scores(s)
        sinks = self.sinks.to(s.dtype).reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        logits = torch.cat([s, sinks], dim=-1)
        # as transformers: the row's largest logit taken off first, the softmax in the model's dtype
        logits = logits - logits.max(dim=-1, keepdim=True).values
        weights = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]  # the sink's share dropped
        if mask is not None:
            weights = weights.masked_fill(mask.blind, 0.0)  # a query that may see nothing attends to nothing
        weights = self.probs(weights)
        dropped = F.dropout(weights, p=self.attention_dropout) if self.training and self.attention_dropout else weights
        return torch.matmul(dropped.to(v.dtype), v), weights


class GptOssExpert(nn.Module):
    """Expert `index`'s hook points; its weights are slices of its bank's tensors (GptOssExperts.run)."""

    def __init__(self, bank: "GptOssExperts", index: int):
        super().__init__()
        object.__setattr__(self, "bank", bank)  # not a submodule: the bank holds this expert, not the other way
        self.index = index
        routed = " (the tokens routed to this expert)"
        self.pre_act = HookPoint("t, m", "the gate (even columns of gate_up_proj, bias added), before its clamp and "
                                 "activation" + routed)
        self.up = HookPoint("t, m", "the linear branch (odd columns of gate_up_proj, bias added), before its clamp "
                            "and the + 1" + routed)
        self.post_act = HookPoint("t, m", "expert neurons: (clamped up + 1) times the clamped gate's SwiGLU" + routed)
        self.proj = HookPoint("t, h", "the expert's output (down_proj, bias added), before its routing weight"
                              + routed)

    def forward(self, x):  # [t, h] -> [t, h]
        return self.bank.run(self.index, x)


class GptOssExperts(nn.Module):
    """num_experts clamped-SwiGLU experts in transformers' layout (its GptOssExperts'): gate_up_proj [E, h, 2m] (gate
    and up in alternate columns), gate_up_proj_bias [E, 2m], down_proj [E, m, h], down_proj_bias [E, h]. Indexed by
    expert like an nn.ModuleList (parts/moe.py's SparseMoeBlock runs experts[e] on expert e's tokens), each expert's
    hook points under its index."""

    def __init__(self, hidden_size: int, expert_size: int, num_experts: int, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = alpha, limit
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * expert_size))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * expert_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, expert_size, hidden_size))
        self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden_size))
        nn.init.normal_(self.gate_up_proj, std=0.02)  # transformers' initializer_range
        nn.init.normal_(self.down_proj, std=0.02)
        for e in range(num_experts):
            self.add_module(str(e), GptOssExpert(self, e))

    def __len__(self) -> int:
        return self.gate_up_proj.shape[0]

    def __getitem__(self, e: int) -> GptOssExpert:
        return self._modules[str(e)]

    def __iter__(self):
        return (self[e] for e in range(len(self)))

    def run(self, e: int, x):  # [t, h] -> [t, h], in transformers' order of operations
        expert = self[e]
        gate_up = x @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]  # [t, 2m]: only expert e's slices are read
        gate, up = expert.pre_act(gate_up[..., ::2]), expert.up(gate_up[..., 1::2])
        gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
        neurons = expert.post_act((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))
        return expert.proj(neurons @ self.down_proj[e] + self.down_proj_bias[e])

    def extra_repr(self) -> str:
        return f"experts={len(self)}, alpha={self.alpha}, limit={self.limit}"


class GptOssDecoderLayer(LlamaDecoderLayer):
    """Llama's layer with GPT-OSS's norm, sinks and mixture of experts."""

    norm = Olmo2RMSNorm
    attention = GptOssAttention

    @staticmethod
    def feed_forward(config: GptOssConfig, layer_idx: int) -> nn.Module:
        experts = GptOssExperts(config.hidden_size, config.intermediate_size, config.num_local_experts,
                                config.swiglu_alpha, config.swiglu_limit)
        return SparseMoeBlock(config.hidden_size, config.intermediate_size, config.num_local_experts,
                              config.num_experts_per_tok, config.hidden_act, renormalize=False, float32_weights=False,
                              router_bias=True, softmax_of_chosen=True, experts=experts)


class GptOssModel(LlamaModel):
    config_class = GptOssConfig
    mapping_table = GPT_OSS
    layer_class, norm = GptOssDecoderLayer, Olmo2RMSNorm

    @classmethod
    def unpacked(cls, checkpoint, dtype):
        """The released files' MXFP4 experts (`*_blocks`, `*_scales`), dequantized as transformers does."""
        return unpacked(checkpoint, dtype)


class GptOssForCausalLM(CausalLM, GptOssModel):
    """GPT-OSS plus the language-model head (`lm_head`): logits over the vocabulary for the token after each
    position."""
