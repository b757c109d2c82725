#!/usr/bin/python3
"""case-tol.py: (re)write a case file's tolerances from `qatcheck tol`.

usage: case-tol.py CASE.json TENSOR=TOL-ARGS [TENSOR=TOL-ARGS ...]
  e.g. case-tol.py cases/linear_bf16.json \\
         "d_x=--out-dtype bfloat16 --acc-dtype float32 --k 1024"
Runs `qatcheck tol TOL-ARGS --tensor TENSOR` for each tensor and replaces
that tensor's entry under "tolerances", keeping every other key of the case
as it was. The binary: $QATCHECK, else the repository's ./qatcheck beside
this script's folder, else `qatcheck` on PATH. Needs no package beyond the
standard library, so any python3 runs it. Errors are one line, exit 2."""
import json
import os
import shlex
import shutil
import subprocess
import sys


def fail(msg):
    print("case-tol.py: error: %s" % msg, file=sys.stderr)
    return 2


def find_qatcheck():
    """$QATCHECK, the repository's ./qatcheck, or qatcheck on PATH."""
    if os.environ.get("QATCHECK"):
        return os.environ["QATCHECK"]
    repo = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "qatcheck")
    if os.access(repo, os.X_OK):
        return repo
    return shutil.which("qatcheck")


def main(argv):
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        print(__doc__, file=sys.stderr)
        return 2
    qc = find_qatcheck()
    if not qc:
        return fail("cannot find the qatcheck binary: build it (make) or set QATCHECK=/path/to/qatcheck")
    try:
        with open(argv[1]) as f:
            case = json.load(f)
    except OSError as e:
        return fail("case '%s': cannot read: %s" % (argv[1], e.strerror))
    except ValueError as e:
        return fail("case '%s': not valid JSON: %s" % (argv[1], e))
    if not isinstance(case, dict):
        return fail("case '%s': expected a JSON object" % argv[1])
    tols = case.setdefault("tolerances", {})
    for spec in argv[2:]:
        tensor, args = spec.split("=", 1)
        try:
            out = subprocess.run([qc, "tol"] + shlex.split(args) + ["--tensor", tensor], capture_output=True, text=True)
        except OSError as e:
            return fail("cannot run '%s': %s" % (qc, e.strerror))
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
