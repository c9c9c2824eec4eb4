#!/usr/bin/env python3
"""Checks of tests/crash/kill_campaign.sh: a run directory RUN, killed and resumed to
completion, against the uninterrupted reference REF of the same command.

  * metrics.jsonl: every line whole (ends with a newline, parses as a JSON object), the same
    steps in the same order as REF, and every field equal to REF's except the timings
    (tokens_per_s, step_ms, mfu), compared as exact JSON values (bit-identical doubles);
  * summary.json completed, with REF's losses and held-out NLLs;
  * the same checkpoint files as REF (keep-checkpoints respected), each with tensors
    (params, adam_m, adam_v, losses) byte-identical to REF's, and the metadata other than
    the trainer's timings equal;
  * nothing a later resume could misread: no *.tmp, no *.corrupt, no error.txt.
Usage: check_run.py REF RUN; exit 1 with the first difference on stderr."""
import json
import os
import struct
import sys

TIMINGS = {"tokens_per_s", "step_ms", "mfu"}


def fail(msg):
    print("check_run: " + msg, file=sys.stderr)
    sys.exit(1)


def metrics(run):
    raw = open(os.path.join(run, "metrics.jsonl"), "rb").read()
    if raw and not raw.endswith(b"\n"):
        fail(f"{run}/metrics.jsonl ends inside a line")
    out = []
    for i, line in enumerate(raw.split(b"\n")[:-1], 1):
        try:
            j = json.loads(line)
        except ValueError as e:
            fail(f"{run}/metrics.jsonl:{i}: not JSON ({e}): {line[:80]!r}")
        if not isinstance(j, dict) or not isinstance(j.get("step"), int):
            fail(f"{run}/metrics.jsonl:{i}: not a metrics line")
        out.append({k: v for k, v in j.items() if k not in TIMINGS})
    return out


def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    t = {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
         for k, v in h.items() if k != "__metadata__"}
    meta = dict(h["__metadata__"])
    trainer = json.loads(meta.pop("trainer"))
    for k in ("train_seconds", "wall_seconds"):
        trainer.pop(k)
    meta.pop("checksum")  # covers the timings
    meta["trainer"] = trainer
    return t, meta


def main():
    ref, run = sys.argv[1], sys.argv[2]
    a, b = metrics(ref), metrics(run)
    if [x["step"] for x in a] != [x["step"] for x in b]:
        fail(f"steps of metrics.jsonl {[x['step'] for x in b]} differ from the reference's "
             f"{[x['step'] for x in a]}")
    for x, y in zip(a, b):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            fail(f"metrics of step {x['step']} differ in {keys}")

    try:
        sa = json.load(open(os.path.join(ref, "summary.json")))
        sb = json.load(open(os.path.join(run, "summary.json")))
    except (OSError, ValueError) as e:
        fail(f"summary.json: {e}")
    if sb.get("status") != "completed":
        fail("summary.json is not 'completed'")
    for k in ("first_loss", "final_window_loss", "heldout_nll", "heldout_nll_quant", "steps",
              "tokens"):
        if sa[k] != sb[k]:
            fail(f"summary.json {k}: {sb[k]!r}, reference {sa[k]!r}")

    ca = sorted(os.listdir(os.path.join(ref, "checkpoints")))
    cb = sorted(os.listdir(os.path.join(run, "checkpoints")))
    if ca != cb:
        fail(f"checkpoints {cb} differ from the reference's {ca}")
    for name in ca:
        ta, ma = tensors(os.path.join(ref, "checkpoints", name))
        tb, mb = tensors(os.path.join(run, "checkpoints", name))
        for k in ("params", "adam_m", "adam_v", "losses"):
            if ta[k] != tb[k]:
                fail(f"{name}: tensor {k} differs from the reference's")
        if ma != mb:
            keys = sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k))
            fail(f"{name}: metadata {keys} differ from the reference's")

    for root, _, files in os.walk(run):
        for f in files:
            if f.endswith(".tmp") or f.endswith(".corrupt") or f == "error.txt":
                fail(f"left behind: {os.path.join(root, f)}")


if __name__ == "__main__":
    main()
