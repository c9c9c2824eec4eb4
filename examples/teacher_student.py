#!/usr/bin/env python3
"""The teacher-student control of the UE5M3 paper (arXiv 2609.02846, Appendix C.1), run through
fp4train's C++ Linear (docs/results.md "The teacher–student control (Appendix C.1)").

A two-layer SiLU MLP teacher 256 -> 256 -> 64 (no biases, W1, W2 ~ N(0, 1/256)) labels 2,048
training and 1,024 evaluation inputs ~ N(0, 1), rounded to BF16, with FP32 targets. A student
starts at the teacher plus 0.25 N(0, 1/256) per layer and trains 500 AdamW steps (lr 2e-3, betas
0.9/0.95, eps 1e-8, no weight decay, constant LR, no clipping) on minibatches of 128 drawn with
replacement, MSE loss. Students:

  * bf16:    the `bf16` recipe: FP32 master weights, BF16 GEMM operands, FP32 accumulation;
  * fp4_sr:  `ue5m3-b16-probe` (UE5M3 block-16 scales, T = 448, D = 50 refreshed at steps 1, 51, ...,
             no RHT, 16x16 weight tiles, the probe-matched GEMM) with fp4.bf16_outputs (each
             linear's Y and dX rounded to BF16, as the paper's runs keep them), SR on dY;
  * fp4_rne: the same with RNE on dY.

For each FP4 student the run is repeated with the probe GEMM's snap grid d in {0 (none), 256,
512, 1024, 2048, 4096} (linear.probe_snap; --grid, whose first value is the base), and every loss
and the final parameters are compared bit for bit with the base run (d = 0 by default).

Everything but the two Linears is numpy float32 in a fixed order, so a run is bit-reproducible on
one machine; the Linears' bits do not depend on the thread count. Nothing is tuned toward the
paper's figures.

Usage:
    PYTHONPATH=build/python /usr/bin/python3 examples/teacher_student.py [--seeds 41,42,43] [--steps 500]
        [--grid 0,256,512,1024,2048,4096] [--out docs/results/paper]

Writes OUT/teacher_student.json (`runs`: seed, student, final_eval_mse and more; `grid_invariance`:
compared and bit_identical counts over seeds x nonzero d x the two roundings, with the list of
differing runs) and OUT/teacher_student.md. Exits 2 on bad arguments or without fp4train.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

try:
    import numpy as np
    import fp4train as fp
except ImportError as e:
    print(f"teacher_student.py: error: {e}; build fp4train (bash scripts/build) and set "
          "PYTHONPATH=build/python (numpy: apt install python3-numpy)", file=sys.stderr)
    sys.exit(2)

D_IN, D_HID, D_OUT = 256, 256, 64
N_TRAIN, N_EVAL, BATCH = 2048, 1024, 128


def bf16(x):
    """RNE to BF16, as float32 values (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(np.float32)


def silu64(h):
    return h / (1.0 + np.exp(-h))


def problem(seed):
    """Teacher weights, BF16 inputs, FP32 targets, the student's start and the batch indices."""
    rng = np.random.default_rng([seed, 0])
    w1 = rng.standard_normal((D_HID, D_IN)) / math.sqrt(D_IN)
    w2 = rng.standard_normal((D_OUT, D_HID)) / math.sqrt(D_HID)
    x_train = bf16(rng.standard_normal((N_TRAIN, D_IN)).astype(np.float32))
    x_eval = bf16(rng.standard_normal((N_EVAL, D_IN)).astype(np.float32))

    def teacher(x):  # in float64, rounded once to FP32
        return (silu64(x.astype(np.float64) @ w1.T) @ w2.T).astype(np.float32)

    s1 = (w1 + 0.25 * rng.standard_normal(w1.shape) / math.sqrt(D_IN)).astype(np.float32)
    s2 = (w2 + 0.25 * rng.standard_normal(w2.shape) / math.sqrt(D_HID)).astype(np.float32)
    return {"x_train": x_train, "y_train": teacher(x_train), "x_eval": x_eval,
            "y_eval": teacher(x_eval), "w1": s1, "w2": s2,
            "batches": np.random.default_rng([seed, 1]).integers(0, N_TRAIN, size=(10**6 // BATCH, BATCH))}


def recipe_for(student, d):
    if student == "bf16":
        return fp.Recipe.load("bf16")
    sets = ["fp4.bf16_outputs=true", f"linear.probe_snap={d}"]
    if student == "fp4_rne":
        sets.append('rounding.dy="rne"')
    return fp.Recipe.load("ue5m3-b16-probe", sets=sets)


def train(p, student, d, seed, steps):
    """One student's run: (losses float32 [steps], w1, w2, eval MSE under its own inference
    forward, eval MSE of its weights in exact float64)."""
    r = recipe_for(student, d)
    l1 = fp._core.Linear(D_IN, D_HID, r, layer=0)
    l2 = fp._core.Linear(D_HID, D_OUT, r, layer=1)
    w1, w2 = p["w1"].copy(), p["w2"].copy()
    f32 = np.float32
    b1, b2, eps, lr = f32(0.9), f32(0.95), f32(1e-8), f32(2e-3)
    m1, v1, m2, v2 = (np.zeros_like(w1), np.zeros_like(w1), np.zeros_like(w2), np.zeros_like(w2))
    losses = np.empty(steps, np.float32)
    for t in range(1, steps + 1):
        idx = p["batches"][t - 1]
        x, y = p["x_train"][idx], p["y_train"][idx]
        h = l1.forward(x, w1, t, seed)
        sg = (f32(1) / (f32(1) + np.exp(-h))).astype(f32)
        a = (h * sg).astype(f32)
        out = l2.forward(a, w2, t, seed)
        diff = (out - y).astype(f32)
        losses[t - 1] = np.mean(diff * diff, dtype=f32)
        dy = (diff * f32(2.0 / diff.size)).astype(f32)
        da, g2 = l2.backward(dy)
        dh = (da * (sg * (f32(1) + h * (f32(1) - sg)))).astype(f32)
        _, g1 = l1.backward(dh, need_dx=False)
        c1, c2 = f32(1) - b1 ** t, f32(1) - b2 ** t
        for w, g, m, v in ((w1, g1, m1, v1), (w2, g2, m2, v2)):
            m *= b1
            m += (f32(1) - b1) * g
            v *= b2
            v += (f32(1) - b2) * g * g
            w -= lr * (m / c1) / (np.sqrt(v / c2) + eps)
    # Evaluation: the student's own inference forward (held references as trained), and the
    # same weights in float64.
    h = l1.forward(p["x_eval"], w1, steps + 1, seed, training=False)
    a = (h * (1 / (1 + np.exp(-h)))).astype(np.float32)
    out = l2.forward(a, w2, steps + 1, seed, training=False)
    mse = float(np.mean((out.astype(np.float64) - p["y_eval"]) ** 2))
    exact = silu64(p["x_eval"].astype(np.float64) @ w1.T.astype(np.float64)) @ w2.T.astype(np.float64)
    mse64 = float(np.mean((exact - p["y_eval"]) ** 2))
    return losses, w1, w2, mse, mse64


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="41,42,43")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--grid", default="0,256,512,1024,2048,4096",
                    help="snap denominators d for the grid-invariance check; the first is the base")
    ap.add_argument("--out", default="docs/results/paper")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        grid = [int(g) for g in args.grid.split(",")]
    except ValueError:
        ap.error("--seeds and --grid are comma-separated integers")
    if not 1 <= args.steps <= 5000:
        ap.error(f"--steps must be in [1, 5000], got {args.steps}")
    bad = [s for s in seeds if not 0 <= s < 2 ** 32]
    if bad:
        ap.error(f"--seeds must be in [0, 2^32), got {bad[0]}")
    bad = [d for d in grid if not (d == 0 or (1 <= d <= 65536 and d & (d - 1) == 0))]
    if bad:
        ap.error(f"--grid values must be 0 (no snap) or powers of two up to 65536, got {bad[0]}")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {args.out}: {e.strerror}")
    t0 = time.time()

    def log(msg):
        if not args.quiet:
            print(f"teacher_student: {msg} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    runs, compared, identical, differing = [], 0, 0, []
    for seed in seeds:
        p = problem(seed)
        w0 = float(np.mean((silu64(p["x_eval"].astype(np.float64) @ p["w1"].T.astype(np.float64))
                            @ p["w2"].T.astype(np.float64) - p["y_eval"]) ** 2))
        for student in ("bf16", "fp4_sr", "fp4_rne"):
            ds = [0] if student == "bf16" else grid
            base = None
            for d in ds:
                losses, w1, w2, mse, mse64 = train(p, student, d, seed, args.steps)
                if base is None:
                    base = (losses, w1, w2)
                    runs.append({"seed": seed, "student": student, "final_eval_mse": mse,
                                 "final_eval_mse_fp64_forward": mse64, "initial_eval_mse_fp64": w0,
                                 "final_train_loss": float(losses[-1]),
                                 "snap": None if student == "bf16" else d})
                    log(f"seed {seed}, {student}: eval MSE {mse:.6g}")
                else:
                    same = (np.array_equal(losses.view(np.uint32), base[0].view(np.uint32)) and
                            np.array_equal(w1.view(np.uint32), base[1].view(np.uint32)) and
                            np.array_equal(w2.view(np.uint32), base[2].view(np.uint32)))
                    compared += 1
                    identical += int(same)
                    if not same:
                        first = int(np.argmax(losses.view(np.uint32) != base[0].view(np.uint32)))
                        differing.append({"seed": seed, "student": student, "d": d,
                                          "first_differing_step": first + 1 if not np.array_equal(
                                              losses.view(np.uint32), base[0].view(np.uint32)) else None})
                    log(f"seed {seed}, {student}, d = {d}: {'bit-identical' if same else 'differs'} to d = {grid[0]}")
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    res = {"meta": {"command": "python3 examples/teacher_student.py " + " ".join(sys.argv[1:]),
                    "steps": args.steps, "seeds": seeds, "grid": grid, "cpu": cpu,
                    "seconds": time.time() - t0, "paper": "arXiv 2609.02846, Appendix C.1"},
           "runs": runs,
           "grid_invariance": {"base_d": grid[0], "compared": compared, "bit_identical": identical,
                               "differing": differing}}
    with open(os.path.join(args.out, "teacher_student.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    md = ["# The teacher-student control (arXiv 2609.02846, Appendix C.1), by fp4train's Linear\n",
          f"`{res['meta']['command']}`: {args.steps} steps, seeds {', '.join(map(str, seeds))}; {cpu}, "
          f"{res['meta']['seconds']:.0f} s.\n",
          "| student | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
          "|---|" + "---|" * (len(seeds) + 1)]
    for student in ("bf16", "fp4_sr", "fp4_rne"):
        v = [r["final_eval_mse"] for r in runs if r["student"] == student]
        md.append(f"| {student} | " + " | ".join(f"{x:.6g}" for x in v) + f" | {sum(v) / len(v):.6g} |")
    md.append(f"\nFinal evaluation MSE under each student's own forward (the FP4 students' inference "
              f"forward: held references, BF16 outputs). Initial (the perturbed teacher, exact): "
              + ", ".join(f"{r['initial_eval_mse_fp64']:.6g}" for r in runs if r["student"] == "bf16") + ".\n")
    md.append(f"Grid invariance: {identical} of {compared} runs with d in {grid[1:]} are bit-identical "
              f"(every loss and the final parameters) to d = {grid[0]}"
              + (" (no other d given: nothing compared)" if compared == 0 else "") + ".\n")
    with open(os.path.join(args.out, "teacher_student.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    if not args.quiet:
        print("\n".join(md))


if __name__ == "__main__":
    main()
