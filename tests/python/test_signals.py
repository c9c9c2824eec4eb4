"""SIGINT during fp4train.gemm: handled after the call, never with a corrupted heap.

oneDNN's JIT GEMM points rsp into the heap while it runs (oneDNN issue #4845); Python's SIGINT
handler, run on such a thread, wrote its signal frame there. Before the package blocked the
asynchronous signals around its C++ calls (fp4/base/signal_mask.h), such a loop aborted with
"corrupted size vs. prev_size while consolidating" in 4 runs out of 4 (a review, 25 s each),
and this 8-second one in about half the runs (2-core AMD EPYC, AVX2): it can miss the bug,
never report it falsely.
"""
import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import random, signal, sys, time
import numpy as np
import fp4train as fp
caught = 0
def count(sig, frame):  # Python's C-level handler still runs on whichever thread takes it
    global caught
    caught += 1
signal.signal(signal.SIGINT, count)
rng = np.random.default_rng(0)
shapes = [(256, 256, 1024), (512, 64, 512), (128, 512, 32), (64, 1024, 256)]
ops = {s: (rng.standard_normal((s[0], s[2])).astype(np.float32),
           rng.standard_normal((s[1], s[2])).astype(np.float32)) for s in shapes}
t0 = time.time()
print("ready", flush=True)
while time.time() - t0 < float(sys.argv[1]):
    for s in shapes:
        c = fp.gemm(*ops[s], mode="decoded")
        junk = [bytearray(random.randint(1, 5000)) for _ in range(20)]  # heap churn
print("caught", caught, flush=True)
"""


def test_sigint_storm_during_gemm_leaves_the_process_intact():
    env = dict(os.environ, OMP_NUM_THREADS="2")
    p = subprocess.Popen([sys.executable, "-c", CHILD, "8"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    sent = 0
    t_end = time.time() + 6
    while time.time() < t_end and p.poll() is None:
        p.send_signal(signal.SIGINT)
        sent += 1
        time.sleep(0.02)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, (p.returncode, err[-2000:])
    caught = int(out.split()[-1])
    # Signals that arrive while a call blocks them are pending and coalesce (POSIX keeps one
    # per signal), so the share handled falls as the machine gets busier (the GEMMs slower):
    # about 0.9 of those sent on an idle 2-core machine, 83 of 234 (0.35) under a parallel
    # build. A tenth says they are delivered after the calls, not lost; the property under
    # test is that the process survives.
    assert sent > 50 and caught >= 0.1 * sent, (sent, caught)
