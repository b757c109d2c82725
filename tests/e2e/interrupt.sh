#!/bin/sh
# interrupt.sh: a run interrupted while the dump sandbox's child is reading
# (src/io/dump_box.c, docs/robustness.md "Signals"): SIGINT sent to the child
# alone, SIGTERM to the child alone, and SIGINT to the whole process group
# (a terminal's Ctrl-C), each a few times, on a vjp reading a chunked,
# gzip-compressed dump (every tensor goes through the child). Each run must
# say interrupted: exit 128 + the signal's number, one error line naming
# the signal, no word of a corrupt or damaged file, and at the report path
# the error report of the interruption, never one that blames the dump.
# Every run is bounded (killed after 60 s: a failure, not a hang).
. "$(dirname "$0")/lib.inc"
"$PY" -c "import h5py" 2>/dev/null || { echo "skip: h5py missing for $PY"; exit 77; }
"$PY" - "$T/d.h5" <<'P' || exit 1
import sys
import h5py
import numpy as np
rng = np.random.default_rng(7)
def bf(a):
    a = np.asarray(a, np.float32).copy()
    a.view(np.uint32)[...] &= 0xFFFF0000
    return a
x, w, dy = bf(rng.standard_normal((8, 64))), bf(1 + 0.1 * rng.standard_normal(64)), bf(rng.standard_normal((8, 64)))
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    for i in range(1500):
        g = f.create_group(f"model.layers.{i}.norm")
        g.attrs["class"] = "rmsnorm"
        for name, a in (("inputs/x", x), ("params/weight", w), ("grad_out/dy", dy)):
            g.create_dataset(name, data=a, chunks=True, compression="gzip")
P
cat >"$T/c.json" <<'J'
{"data": {"dump": "d.h5"}, "candidate": "builtin", "contract": {"eps": 1e-6},
 "tolerances": {"d_x": {"rel_l2": 2e-2, "reasoning": "bf16"}, "d_weight": {"rel_l2": 2e-2, "reasoning": "bf16"}}}
J
"$PY" - "$QATCHECK" "$T" <<'P'
import json, os, signal, subprocess, sys, time
qc, T = sys.argv[1], sys.argv[2]
fails = 0
def say(ok, msg, detail=""):
    global fails
    print(("ok   " if ok else "FAIL ") + msg + ("" if ok or not detail else ": " + detail))
    fails += not ok
def children(pid):
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out
def sandbox_child(pid):
    for c in children(pid):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                if b"--qc-dump-sandbox" in f.read():
                    return c
        except OSError:
            pass
    return None
def start():
    # a process group of its own, the signals' default actions (a shell's
    # background job would ignore SIGINT)
    def pre():
        os.setpgrp()
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
    with open(f"{T}/r.json", "w") as f:
        f.write('{"old": "a report from an earlier run"}\n')
    return subprocess.Popen([qc, "vjp", "--case", f"{T}/c.json", "--json", f"{T}/r.json"], cwd=T,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=pre)
def one(desc, target, sig):
    """One run, signalled once its sandbox child reads: None when it ended
    before the signal could reach the child (try again), else judged."""
    p = start()
    child, t0 = None, time.time()
    while child is None and p.poll() is None and time.time() - t0 < 30:
        child = sandbox_child(p.pid)
        time.sleep(0.01)
    if child is None:
        p.kill(); p.wait()
        return None
    time.sleep(0.2)  # the map read, the module reads under way
    try:
        if target == "child":
            os.kill(child, sig)
        else:
            os.killpg(p.pid, sig)
    except ProcessLookupError:  # the run ended first (a fast machine): try again
        p.communicate()
        return None
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        say(False, f"{desc}: still running 60 s after the signal")
        return True
    err = err.decode(errors="replace")
    if p.returncode == 0 and target == "child":
        return None  # the run had read all it needed: the child's end was never seen
    name = signal.Signals(sig).name
    want = 128 + sig
    lines = [l for l in err.splitlines() if l.startswith("qatcheck: error:")]
    rep = open(f"{T}/r.json").read()
    say(p.returncode == want, f"{desc}: exit {p.returncode} (expected {want})")
    say(len(lines) == 1 and f"interrupted by {name}" in lines[0], f"{desc}: one line, interrupted by {name}", repr(err.strip()))
    say("corrupt" not in err and "damaged" not in err, f"{desc}: no file blamed on stderr")
    try:
        r = json.loads(rep)
    except ValueError:
        r = {}
    say(r.get("verdict") == "error" and f"interrupted by {name}" in r.get("error", "") and "corrupt" not in rep and "damaged" not in rep,
        f"{desc}: r.json is the interruption's error report", repr(rep[:300]))
    return True
for desc, target, sig, times in (("SIGINT to the sandbox child", "child", signal.SIGINT, 3),
                                 ("SIGTERM to the sandbox child", "child", signal.SIGTERM, 1),
                                 ("SIGINT to the process group", "group", signal.SIGINT, 4)):
    done = tries = 0
    while done < times and tries < 3 * times:
        tries += 1
        if one(f"{desc} (run {done + 1})", target, sig):
            done += 1
    say(done == times, f"{desc}: {done} of {times} runs signalled while the child was reading")
sys.exit(1 if fails else 0)
P
[ $? -eq 0 ] || bad "interrupted runs (above)"
finish
