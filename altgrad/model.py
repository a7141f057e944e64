"""The nanoGPT backbone in plain PyTorch: a GPT that knows nothing of quantization.

Names follow nanoGPT (and so GPT-2): `wte`, `wpe`, `h.<i>.attn.c_attn`, `c_proj`, `mlp.c_fc`, `lm_head`. Quantization
is applied from outside by swapping these `nn.Linear` modules by name, so this file stays the paper's model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    """Shape of a GPT: context length, vocabulary, depth, heads, width, dropout, and whether Linears have biases.

    The shape has no default here: the presets are conf/model/*.yaml (nano, gpt_50m, gpt2_124m). Dropout and biases
    are off unless asked for, as in the presets."""

    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = False

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}; "
                "valid: n_embd a multiple of n_head"
            )


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; one fused q,k,v projection (`c_attn`) and an output projection (`c_proj`)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: expand 4x (`c_fc`), GELU, project back (`c_proj`)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT language model with the output head tied to the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying (Press & Wolf 2017): one matrix embeds tokens and scores them.
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer) so the residual stream's variance
        # does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without position embeddings (token embeddings are shared with the head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) for token ids idx (B, T)."""
        _, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds model.block_size={self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12·L·H·Q·T."""
        cfg = self.config
        head_dim = cfg.n_embd // cfg.n_head
        return 6 * self.num_params() + 12 * cfg.n_layer * cfg.n_head * head_dim * cfg.block_size

    def estimate_mfu(self, tokens_per_second: float, peak_flops: float) -> float:
        """Model FLOPs utilisation: achieved training FLOP/s as a fraction of the given hardware peak FLOP/s."""
        return self.flops_per_token() * tokens_per_second / peak_flops

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Sample max_new_tokens continuations of idx (B, T), cropping the context to block_size."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            # forward() directly: a torch.compile'd module would recompile for every new context length
            logits = self.forward(context)[:, -1, :] / temperature
            probs = F.softmax(logits.float(), dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
