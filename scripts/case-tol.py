#!/usr/bin/python3
"""case-tol.py: (re)write a case file's tolerances from `qatcheck tol`.

usage: case-tol.py CASE.json TENSOR=TOL-ARGS [TENSOR=TOL-ARGS ...]
  e.g. case-tol.py cases/linear_bf16.json \\
         "d_x=--out-dtype bfloat16 --acc-dtype float32 --k 1024"
Runs `qatcheck tol TOL-ARGS --tensor TENSOR` for each tensor (QATCHECK
names the binary, default ./qatcheck) and replaces that tensor's entry
under "tolerances", keeping every other key of the case as it was."""
import json
import os
import shlex
import subprocess
import sys


def main(argv):
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        print(__doc__, file=sys.stderr)
        return 2
    qc = os.environ.get("QATCHECK", "./qatcheck")
    with open(argv[1]) as f:
        case = json.load(f)
    tols = case.setdefault("tolerances", {})
    for spec in argv[2:]:
        tensor, args = spec.split("=", 1)
        out = subprocess.run([qc, "tol"] + shlex.split(args) + ["--tensor", tensor], capture_output=True, text=True)
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            return 2
        tols.update(json.loads(out.stdout))
    lines = ["{"]
    items = list(case.items())
    for i, (k, v) in enumerate(items):
        end = "," if i + 1 < len(items) else ""
        if k == "tolerances":
            lines.append('  "tolerances": {')
            tl = list(v.items())
            for j, (tn, tv) in enumerate(tl):
                lines.append("    %s: %s%s" % (json.dumps(tn), json.dumps(tv), "," if j + 1 < len(tl) else ""))
            lines.append("  }" + end)
        else:
            lines.append("  %s: %s%s" % (json.dumps(k), json.dumps(v), end))
    lines.append("}")
    with open(argv[1] + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(argv[1] + ".tmp", argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
