#!/usr/bin/env python3
"""The numerics telemetry of a study, one line per recipe (docs/results.md "The verdicts").

Usage: python3 tools/study_telemetry.py STUDY_DIR

STUDY_DIR is a `fp4train compare` directory (docs/results/study). From each finished run's
metrics.jsonl or compacted metrics.jsonl.zst (the `telemetry` records: per FP4 linear and operand role x, w, dy, xt, dyt),
prints per recipe, over its seeds, its telemetry steps after step 1 and its FP4 linears:

  * saturated: the mean fraction of blocks whose scale clipped at the scale format's maximum
    (amax above the held reference's range), and the largest such fraction of any linear,
    role and step;
  * zero-guard: the mean fraction of blocks whose scale underflowed to the zero guard;
  * staleness: the largest amax / held reference ratio seen (1 = the reference is current;
    above 1 the tensor outgrew its held reference);
  * rel. error of dY: the mean relative quantization error of the upstream gradient (the SR
    operand of the paper's recipe).

Recipes without FP4 linears (bf16, fp32) have no telemetry and are listed as such. Standard
library only, and tools/run_metrics.py (zstandard or the zstd program for compacted runs).
Exits with status 2 naming the file on unreadable input.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_metrics  # noqa: E402  (tools/run_metrics.py)


def fail(msg):
    print(f"study_telemetry.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[1])
        sys.exit(0 if len(sys.argv) == 2 else 2)
    d = sys.argv[1]
    if not os.path.isdir(d):
        fail(f"{d} is not a directory")
    acc = {}  # recipe -> lists
    for name in sorted(os.listdir(d)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if not m or not os.path.exists(os.path.join(d, name, "summary.json")):
            continue
        try:
            mp = (run_metrics.metrics_path(os.path.join(d, name))
                  or os.path.join(d, name, run_metrics.PLAIN))
            f = run_metrics.open_metrics(mp)
        except (OSError, run_metrics.MetricsError) as e:
            fail(str(e))
        a = acc.setdefault(m.group(1), {"runs": 0, "sat": [], "zg": [], "stale": [], "err": []})
        a["runs"] += 1
        ln = 0
        try:
            with f:
                for ln, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    j = json.loads(line)
                    if "telemetry" not in j or j.get("step", 0) <= 1:
                        continue
                    for roles in j["telemetry"].values():
                        for role, t in roles.items():
                            a["sat"].append(t["saturated_blocks"])
                            a["zg"].append(t["zero_guard_blocks"])
                            if t.get("staleness") is not None:
                                a["stale"].append(t["staleness"])
                            if role == "dy":
                                a["err"].append(t["rel_error"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{mp}:{ln}: {e}")
    print(f"{'recipe':22} {'runs':>4} {'saturated mean':>15} {'max':>9} {'zero-guard':>11}"
          f" {'max amax/held':>14} {'dY rel. err':>12}")
    for r, a in acc.items():
        if not a["sat"]:
            print(f"{r:22} {a['runs']:4d}   no FP4 telemetry")
            continue
        mean = lambda v: sum(v) / len(v)
        print(f"{r:22} {a['runs']:4d} {100 * mean(a['sat']):14.4f}% {100 * max(a['sat']):8.3f}%"
              f" {100 * mean(a['zg']):10.4f}% {max(a['stale']) if a['stale'] else float('nan'):14.2f}"
              f" {mean(a['err']) if a['err'] else float('nan'):12.4f}")


if __name__ == "__main__":
    main()
