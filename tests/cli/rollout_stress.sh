#!/usr/bin/env bash
# `fp4train rollout`'s stability stress and a deliberately biased recipe (docs/fidelity.md
# "Stability stress"), on a micro fp32 run (lr 3e-3, checkpoints every 5 steps):
#  * a biased recipe shows a growing gap: nvfp4-all with every dY block scale aimed at T = 0.01
#    (a block whose amax is below about a tenth of the tensor's underflows to zero: the gradient
#    is biased toward 0). Its loss gap to fp32 at step 1 is the forward's alone (~5e-4); by steps
#    9..16 it has grown past 0.01 and 10x that, while nvfp4-all (unbiased SR on dY) stays
#    within a quarter of it;
#  * --lr-scale 1 is no stress (the same traces, no "stress" object); --lr-scale 3 leaves step 1's
#    loss (computed before the first update) bit-identical and changes step 2's; --batch-size 2
#    changes step 1's batch;
#  * a stress that breaks training (--lr-scale 1e6): every rollout stops at a non-finite step,
#    counted 1 per rollout in the stability table, the message kept; weights that train to the
#    end but blow up the held-out evaluation count as non-finite there (no crash);
#  * --no-warmup from a checkpoint inside the warmup changes the next step's loss;
#  * the stability table's counts are the ones tools/rollout_stats.py recounts from the traces;
#  * --from with --spike-threshold recounts the spikes; bad stress values are refused.
# Usage: rollout_stress.sh <fp4train binary> <source dir>
set -uo pipefail
bin=$1; src=$2
work=${KEEP_WORK:-$(mktemp -d)}; [ -n "${KEEP_WORK:-}" ] || trap 'rm -rf "$work"' EXIT; mkdir -p "$work"
source "$(dirname "$0")/lib/micro.bash"

micro_setup "$work" steps=30 lr=3e-3 warmup_steps=2 interval=100 windows=4 telemetry_interval=0
"$bin" train --config "$work/micro.toml" --recipe fp32 --out "$work/ref" --quiet --save-every 5 \
  --keep-checkpoints 10 > "$work/train.txt" 2>&1 || { cat "$work/train.txt"; fail "train"; }

expect_error "--lr-scale must be a finite number above 0, got 0" rollout --run "$work/ref" --recipe fp32 --lr-scale 0
expect_error "--batch-size: Value 0 not in range" rollout --run "$work/ref" --recipe fp32 --batch-size 0
expect_error "--spike-threshold must be a finite number of nats above 0, got -1" rollout --run "$work/ref" --recipe fp32 --spike-threshold -1
expect_error "--grad-norm-limit must be a finite number above 0, got nan" rollout --run "$work/ref" --recipe fp32 --grad-norm-limit nan
[ ! -e "$work/ref/rollout" ] || fail "a bad option created the output directory"
expect_error "--batch-size 8 is more than the run's train.batch_size = 4" rollout --run "$work/ref" --recipe fp32 --batch-size 8
expect_error "the stress (--lr-scale, --no-warmup, --batch-size) go with new ones" rollout --from "$work/x.json" --lr-scale 2

# The biased recipe: nvfp4-all, dY of every linear at T = 0.01.
sed -e 's/^name = .*/name = "nvfp4-dy-underflow"/' "$src/configs/recipes/nvfp4-all.toml" > "$work/biased.toml"
cat >> "$work/biased.toml" <<'TOML'

[[override]]
linears = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
role = "dy"
scale_target = 0.01
TOML
run() {  # run NAME ARGS...: a rollout into $work/NAME
  local name=$1; shift
  "$bin" rollout --run "$work/ref" --resamples 100 --quiet --out "$work/$name" "$@" > "$work/$name.txt" 2>&1 \
    || { cat "$work/$name.txt"; fail "rollout $name"; }
}
run bias --recipe "$work/biased.toml,nvfp4-all" --steps 5,10 --length 16 --orders 2
run plain --recipe nvfp4-all --steps 5 --length 3 --orders 1
run lr1 --recipe nvfp4-all --steps 5 --length 3 --orders 1 --lr-scale 1
run lr3 --recipe nvfp4-all --steps 5 --length 3 --orders 1 --lr-scale 3
run bs2 --recipe nvfp4-all --steps 5 --length 3 --orders 1 --batch-size 2
run boom --recipe nvfp4-all --steps 5,10 --length 6 --orders 1 --lr-scale 1e6 --no-warmup
run bs4 --recipe nvfp4-all --steps 5 --length 3 --orders 1 --batch-size 4
run evalnan --recipe ue5m3-b16 --steps 5 --length 10 --orders 2 --lr-scale 1e5 --no-warmup
run hot --recipe nvfp4-all,ue5m3-b16 --steps 5,10 --length 6 --orders 2 --lr-scale 30
# A run still warming up (8 steps) at its checkpoint 2: --no-warmup changes step 3.
mkdir -p "$work/w"
sed -e 's/^warmup_steps = 2$/warmup_steps = 8/' -e 's/^steps = 30$/steps = 12/' "$work/micro.toml" > "$work/w/micro.toml"
"$bin" train --config "$work/w/micro.toml" --recipe fp32 --out "$work/w/ref" --quiet --save-every 2 --keep-checkpoints 10 \
  > "$work/w/train.txt" 2>&1 || { cat "$work/w/train.txt"; fail "train (warmup 8)"; }
for nw in "" --no-warmup; do
  "$bin" rollout --run "$work/w/ref" --recipe fp32 --steps 2 --length 2 --orders 1 --resamples 10 --quiet \
    --out "$work/w/r$nw" $nw > "$work/w/r$nw.txt" 2>&1 || { cat "$work/w/r$nw.txt"; fail "rollout $nw"; }
done

python3 - "$work" "$src" <<'PY' || fail "rollout stress results"
import json, sys
work = sys.argv[1]
load = lambda n: json.load(open(f"{work}/{n}/rollout.json"))
b = load("bias")
T = b["traces"]
def gaps(i):  # mean over (checkpoint, order) of recipe i minus fp32, per step
    n = len(b["steps"]) * b["orders"]
    return [sum(T[i][c][o]["loss"][k] - T[0][c][o]["loss"][k] for c in range(2) for o in range(2)) / n
            for k in range(b["length"])]
biased, control = gaps(1), gaps(2)
late = lambda g: sum(g[8:16]) / 8
early = lambda g: sum(g[1:4]) / 3
print("biased gap by step:", " ".join(f"{v:+.4f}" for v in biased))
assert late(biased) > 0.01 and late(biased) > 10 * abs(biased[0]), (biased[0], late(biased))
assert late(biased) > early(biased), "the biased recipe's gap does not grow"
assert abs(late(control)) < late(biased) / 4, (late(control), late(biased))

plain, lr1, lr3, bs2 = load("plain"), load("lr1"), load("lr3"), load("bs2")
assert lr1["traces"] == plain["traces"] and "stress" not in lr1, "--lr-scale 1 changed the rollouts"
assert lr3["stress"] == {"lr_scale": 3.0, "no_warmup": False, "batch_size": 0}, lr3["stress"]
for r in range(2):
    p, s = plain["traces"][r][0][0]["loss"], lr3["traces"][r][0][0]["loss"]
    assert p[0] == s[0] and p[1] != s[1], (p, s)
    assert bs2["traces"][r][0][0]["loss"][0] != p[0], "--batch-size 2 ran the same batch"
assert bs2["stress"]["batch_size"] == 2

boom = load("boom")
for r in range(2):
    for c in range(2):
        t = boom["traces"][r][c][0]
        assert t["diverged"].startswith("step ") and "non-finite" in t["diverged"], t["diverged"]
bs4 = load("bs4")  # the run's own batch size: no stress, the plain rollouts
assert "stress" not in bs4 and bs4["traces"] == plain["traces"], "--batch-size 4 (the run's) is a stress"
ev = load("evalnan")["traces"][1][0]
assert all(t["diverged"].startswith("held-out evaluation after step 15: non-finite") for t in ev), ev
# fp32 and ue5m3-b16 stopped in every rollout: no gap left, every cell "—".
md_ev = open(f"{work}/evalnan/rollout.md").read()
row = next(l for l in md_ev.splitlines() if l.startswith("| `ue5m3-b16` | ") and l.count("|") == 8)
assert [c.strip() for c in row.split("|")[2:7]] == ["—"] * 5, row
# One rollout of four stopped (edited into the "hot" set): left out of that recipe's cells,
# which say so, and of nothing else.
h = json.load(open(f"{work}/hot/rollout.json"))
t = h["traces"][2][1][0]
t["loss"][3:] = [None] * 3; t["grad_norm"][3:] = [None] * 3
t["nll"] = t["nll_fp32"] = t["divergence"] = None
t["diverged"] = "step 14: non-finite gradient norm"
import os
os.makedirs(f"{work}/cut", exist_ok=True)
json.dump(h, open(f"{work}/cut/rollout.json", "w"))
w0, w1 = (load(n)["traces"][0][0][0]["loss"] for n in ("w/r", "w/r--no-warmup"))
assert w0[0] == w1[0] and w0[1] != w1[1], (w0, w1)
# The stability table against an independent recount of the traces (tools/rollout_stats.py).
sys.path.insert(0, sys.argv[2] + "/tools")
import rollout_stats as rs
hot = rs.load(f"{work}/hot/rollout.json")
md = open(f"{work}/hot/rollout.md").read()
total = 0
for r, name in enumerate(hot["recipes"]):
    cells = []
    for k in rs.COUNTS:
        g = rs.count_grid(hot, r, k)
        m = sum(sum(row) for row in g) / 4
        total += m if k != "spikes" or r > 0 else 0
        cells.append("—" if (k == "spikes" and r == 0) else f"{m:+.2f} [")
    row = next(l for l in md.splitlines() if l.startswith(f"| `{name}` | ") and ("—" in l or "[" in l) and l.count("|") == 6)
    parts = [p.strip() for p in row.split("|")[2:5]]
    for want, got in zip(cells, parts):
        assert got.startswith(want), (name, want, got)
assert total > 0, "no counts to compare: make the stress stronger"
md = open(f"{work}/boom/rollout.md").read()
assert "Stress: peak learning rate x 1e+06, no warmup" in md and "**Stressed** (docs/fidelity.md" in md
assert "| `nvfp4-all` | +0.00 [+0.00, +0.00] | " in md and "| +1.00 [+1.00, +1.00] | 0 of 2 |" in md, md
print("rollout stress: biased gap grows, stress knobs and non-finite counts as expected")
PY

"$bin" rollout --from "$work/cut/rollout.json" > "$work/cut.txt" 2>&1 || { cat "$work/cut.txt"; fail "--from cut"; }
row=$(grep '^| `ue5m3-b16` | ' "$work/cut/rollout.md" | head -1)
[ "$(grep -o '(3 of 4)' <<<"$row" | wc -l)" = 5 ] || fail "the stopped rollout is not left out of ue5m3-b16's 5 cells: $row"
grep '^| `nvfp4-all` | ' "$work/cut/rollout.md" | head -1 | grep -q 'of 4)' && fail "nvfp4-all lost a rollout"
grep -q "left out of the cell" "$work/cut/rollout.md" || fail "no note on rollouts left out"

# --from recounts with another threshold: at 1e-9 nats every step where the biased recipe's loss
# is above fp32's is a spike.
"$bin" rollout --from "$work/bias/rollout.json" --resamples 100 --spike-threshold 1e-9 --out "$work/recount" \
  > "$work/recount.txt" 2>&1 || { cat "$work/recount.txt"; fail "--from --spike-threshold"; }
grep -q "by more than 1e-09 nats" "$work/recount/rollout.md" || fail "--from did not take --spike-threshold"
grep -q "by more than 0.1 nats" "$work/bias/rollout.md" || fail "the default threshold is not 0.1"
grep -qE '^\| `[^`]*biased.toml` \| \+(1[0-9]|[2-9])\.[0-9]{2} ' "$work/recount/rollout.md" \
  || { cat "$work/recount/rollout.md"; fail "the recount's spikes"; }
echo "rollout_stress: ok"
