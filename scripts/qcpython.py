"""qcpython.py: the scripts' interpreter check. qatcheck's Python scripts
need numpy, h5py, torch, safetensors or ml_dtypes, which
scripts/install-deps.sh installs for Debian's /usr/bin/python3; another
python3 first on PATH (pyenv, conda, a venv) may lack them. A script calls

    import qcpython; qcpython.need("h5py", "numpy")

before importing them: when this interpreter lacks one and /usr/bin/python3
(or $QATCHECK_PYTHON) has them all, the script is re-run with that one (a
note on stderr says so); otherwise it exits 2 with one line naming what is
missing and which interpreter to use, instead of a traceback."""
import importlib.util
import os
import subprocess
import sys

PREFERRED = os.environ.get("QATCHECK_PYTHON", "/usr/bin/python3")


def need(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "qatcheck script"
    here = os.path.realpath(sys.executable or "")
    if os.environ.get("QATCHECK_PY_REEXEC") != "1" and os.path.exists(PREFERRED) and os.path.realpath(PREFERRED) != here \
            and sys.argv and os.path.exists(sys.argv[0]):
        probe = subprocess.run([PREFERRED, "-c", "import " + ", ".join(modules)], capture_output=True)
        if probe.returncode == 0:
            print("%s: %s lacks %s: running it with %s" % (script, sys.executable, ", ".join(missing), PREFERRED),
                  file=sys.stderr)
            os.execve(PREFERRED, [PREFERRED] + sys.argv, dict(os.environ, QATCHECK_PY_REEXEC="1"))
    print("%s: error: needs %s, which %s lacks: run it with %s (scripts/install-deps.sh installs them for it), "
          "or set QATCHECK_PYTHON to an interpreter that has them" % (script, ", ".join(missing), sys.executable, PREFERRED),
          file=sys.stderr)
    sys.exit(2)
