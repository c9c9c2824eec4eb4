#!/usr/bin/env python3
"""Train a small PyTorch MLP whose linear layers are fp4train's quantized Linear.

A two-layer MLP (64 -> 256 -> 64, ReLU) learns a fixed random teacher MLP on Gaussian inputs
with AdamW; both linears are fp4train.torch.Linear under a recipe (default ue5m3-b16: FP4 E2M1
with UE5M3 block scales, SR on the upstream gradient, held references refreshed every 50 steps),
so every fprop, dgrad and wgrad GEMM runs fp4train's exact FP4 emulation. The StepContext is
advanced after every optimizer step (it keys the SR bytes and clocks the held references).

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_mlp.py [--recipe nvfp4-te] [--steps 200]

Prints the mean-squared error every few steps and, at the end, the FP32 recipe's for comparison.
"""
import argparse

import torch

import fp4train.torch as ft


def mlp(recipe, steps, seed, hidden):
    torch.manual_seed(seed)
    return torch.nn.Sequential(ft.Linear(64, hidden, recipe, layer=0, steps=steps, bias=False),
                               torch.nn.ReLU(),
                               ft.Linear(hidden, 64, recipe, layer=1, steps=steps, bias=False))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="ue5m3-b16")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--no-reference", action="store_true", help="skip the FP32 recipe's run")
    a = p.parse_args(argv)
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(123)
    teacher = (torch.randn(64, 64, generator=g) / 8, torch.randn(64, 64, generator=g) / 8)
    results = {}
    for recipe in (a.recipe,) if a.no_reference else (a.recipe, "fp32"):
        steps = ft.StepContext(seed=a.seed)
        model = mlp(recipe, steps, a.seed, a.hidden)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        data = torch.Generator().manual_seed(a.seed)
        every = max(1, a.steps // 10)
        for step in range(1, a.steps + 1):
            x = torch.randn(a.batch, 64, generator=data)
            y = torch.relu(x @ teacher[0]) @ teacher[1]
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps.advance()
            if recipe == a.recipe and (step == 1 or step % every == 0):
                print(f"step {step:4d} loss {loss.item():.6f}")
        results[recipe] = loss.item()
    print(f"final loss: {a.recipe} {results[a.recipe]:.6f}" +
          ("" if a.no_reference else f", fp32 {results['fp32']:.6f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
