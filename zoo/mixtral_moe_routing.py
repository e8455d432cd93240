"""A small mixture-of-experts language model whose expert layers route tokens the way Hugging Face's Mixtral does
(huggingface/transformers, src/transformers/models/mixtral/modeling_mixtral.py, `MixtralSparseMoeBlock.forward`):
a router picks the top 2 of 8 experts per token, then `expert_mask.sum(...).nonzero()` finds the experts that
got tokens and, for each, `torch.where(expert_mask[expert_idx])` gathers its tokens, runs the expert (a SwiGLU
MLP) on them and `index_add_`s the weighted result back. `nonzero` and `where` must know how many tokens each
expert got before they can return, so the forward waits for the GPU once per layer and once per expert hit,
and every expert's matrix products change shape from step to step. 4 decoder layers (SDPA attention, 512
wide, 8 heads, experts of 1024), 256 tokens, batch 8, vocab 8192, bf16 autocast, fused AdamW, token batches
drawn on the GPU."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import SelfAttention

FIXES = {
    "host_sync": "dense dispatch: every expert runs on every token and is weighted by the router's weight (zero for "
                 "the experts not chosen): the same outputs and gradients, no synchronization, fixed shapes",
    "launch_bound": GRAPHS_FIX + "; the routing left as it is",
}

SIZES = {"tiny": dict(vocab=256, layers=2, heads=2, width=32, ffn=64, experts=4, seq=16, batch=2),
         "full": dict(vocab=8192, layers=4, heads=8, width=512, ffn=1024, experts=8, seq=256, batch=8)}
TOP_K = 2


class Expert(nn.Module):
    def __init__(self, width, ffn):
        super().__init__()
        self.w1, self.w3 = nn.Linear(width, ffn, bias=False), nn.Linear(width, ffn, bias=False)
        self.w2 = nn.Linear(ffn, width, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    def __init__(self, width, ffn, experts, dense=False):
        super().__init__()
        self.num_experts, self.dense = experts, dense
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(Expert(width, ffn) for _ in range(experts))

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, TOP_K, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)
        if self.dense:
            weights = torch.zeros_like(router_logits, dtype=hidden_states.dtype).scatter(1, selected_experts,
                                                                                          routing_weights)
            out = sum(expert(hidden_states) * weights[:, i, None] for i, expert in enumerate(self.experts))
            return out.reshape(batch_size, sequence_length, hidden_dim)
        final_hidden_states = torch.zeros((batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype,
                                          device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            expert_layer = self.experts[expert_idx]
            idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = expert_layer(current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        return final_hidden_states.reshape(batch_size, sequence_length, hidden_dim)


class Layer(nn.Module):
    def __init__(self, cfg, dense):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg["width"]), nn.LayerNorm(cfg["width"])
        self.attn = SelfAttention(cfg["width"], cfg["heads"], "sdpa", causal=True)
        self.moe = SparseMoeBlock(cfg["width"], cfg["ffn"], cfg["experts"], dense)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.moe(self.ln_2(x))


class MoeLM(nn.Module):
    def __init__(self, cfg, dense=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg["vocab"], cfg["width"]), nn.Embedding(cfg["seq"], cfg["width"])
        self.layers = nn.ModuleList(Layer(cfg, dense) for _ in range(cfg["layers"]))
        self.ln_f = nn.LayerNorm(cfg["width"])
        self.lm_head = nn.Linear(cfg["width"], cfg["vocab"], bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    model = MoeLM(cfg, dense=fix == "host_sync").to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)
    dtype = half_dtype(device)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    state = {"k": 0}

    def step():
        g.manual_seed(int(rng(seed, state["k"]).integers(2**62)))
        data = torch.randint(0, V, (B, T + 1), device=device, generator=g)
        x, y = reordered(perm, data[:, :-1], data[:, 1:])
        mark()
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(x)
            loss = F.cross_entropy(logits.view(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["k"] += 1
        return loss.detach()

    step.model = model
    return step
