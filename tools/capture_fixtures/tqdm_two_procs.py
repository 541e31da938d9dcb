"""Two processes, each drawing its own unprefixed tqdm bar (tqdm_loop.py, desc "train"), into ONE log.

    python tqdm_two_procs.py [--steps 300] [--sleeps 0.02 0.03] [--clock PREFIX]

Starts one child ``tqdm_loop.py --steps N --sleep S --desc train`` per ``--sleeps`` value, at the
same time; every child inherits this process's stdout/stderr (so all bars land in the same file,
interleaved at the byte level as the OS writes them). ``--clock PREFIX`` makes child i write its
step-end clock to ``PREFIX_proc<i>.txt``. Exits with the first non-zero child status (0 if none).
Used by capture.sh for tqdm_two_procs.log.
"""

import argparse
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--sleeps", type=float, nargs="+", default=[0.02, 0.03])
ap.add_argument("--clock", default=None, help="child i writes its clock to PREFIX_proc<i>.txt")
ap.add_argument("--postfix-every", type=int, default=1)
args = ap.parse_args()

loop = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tqdm_loop.py")
children = []
for i, s in enumerate(args.sleeps):
    cmd = [sys.executable, loop, "--steps", str(args.steps), "--sleep", str(s), "--desc", "train",
           "--seed", str(i), "--postfix-every", str(args.postfix_every)]
    if args.clock:
        cmd += ["--clock", f"{args.clock}_proc{i}.txt"]
    children.append(subprocess.Popen(cmd))  # stdin/stdout/stderr inherited
rcs = [c.wait() for c in children]
sys.exit(next((rc for rc in rcs if rc), 0))
