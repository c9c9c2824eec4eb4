#!/usr/bin/env python3
"""Train a small PyTorch transformer whose nn.Linear layers fp4train.torch.convert swapped for
fp4train's quantized Linear.

The model is plain PyTorch: a character embedding, a ModuleList `layers` of pre-norm blocks
(causal self-attention from nn.Linear q/k/v/o projections, a GELU MLP of up_proj/down_proj, all
with biases), a final LayerNorm and an nn.Linear LM head. `convert(model, recipe,
optimizer=opt)` swaps the linears inside `layers` (the recipe's blocks: one per child) for
fp4train.torch.Linear, keeps the LM head in FP32 (outside the blocks, as fp4train keeps its own),
applies the recipe's high-precision blocks and overrides, and advances the StepContext after every
optimizer step. The corpus is this file's own text, as characters, so nothing is downloaded.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_convert.py [--recipe nvfp4-te] [--steps 20]

Prints the conversion (one line per nn.Linear) and the training loss at every step.
"""
import argparse
import math

import torch
import torch.nn.functional as F

import fp4train.torch as ft


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal multi-head attention, then a GELU MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(d, d) for _ in range(4))
        self.up_proj, self.down_proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(B, T, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        att = q @ k.transpose(-1, -2) / math.sqrt(D // self.heads)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.down_proj(F.gelu(self.up_proj(self.norm2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab, d, n_layers, heads, seq):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(seq, d))
        self.layers = torch.nn.ModuleList(Block(d, heads) for _ in range(n_layers))
        self.norm = torch.nn.LayerNorm(d)
        self.lm_head = torch.nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for b in self.layers:
            x = b(x)
        return self.lm_head(self.norm(x))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="ue5m3-b16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(a.seed)
    text = open(__file__, encoding="utf-8").read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    model = TinyLM(len(chars), a.d_model, a.layers, 2, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = ft.StepContext(seed=a.seed)
    ft.convert(model, a.recipe, steps=steps, optimizer=opt, verbose=True)
    g = torch.Generator().manual_seed(a.seed)
    for step in range(1, a.steps + 1):
        starts = torch.randint(0, len(data) - a.seq - 1, (a.batch,), generator=g)
        ids = torch.stack([data[s:s + a.seq + 1] for s in starts.tolist()])
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, len(chars)), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()  # also moves `steps` to the next step (convert's optimizer hook)
        print(f"step {step:3d} (fp4train step {steps.step - 1}) loss {loss.item():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
