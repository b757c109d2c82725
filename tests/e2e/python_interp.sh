#!/bin/sh
# python_interp.sh: qatcheck's Python scripts find the interpreter that has
# their packages or say which one to use, never a traceback. An interpreter
# without them (here /usr/bin/python3 -S: no dist-packages) re-runs the
# script with $QATCHECK_PYTHON when that one has them; when none does, one
# error line names what is missing and the interpreter to use (exit 2).
# case-tol.py runs from any folder (it finds the repository's binary) and
# reports a missing case in one line. The dump helper, imported without
# torch or h5py, names the interpreter that has them.
. "$(dirname "$0")/lib.inc"
"$PY" -c "import h5py, numpy" 2>/dev/null || { echo "skip: h5py or numpy missing for $PY"; exit 77; }
"$PY" -S -c "import numpy" 2>/dev/null && { echo "skip: $PY -S still finds numpy: no interpreter without it to test"; exit 77; }
printf '#!/bin/sh\nexec %s "$@"\n' "$PY" >"$T/py" && chmod +x "$T/py"

QATCHECK_PYTHON="$T/py" expect_exit 0 "a script run by an interpreter without h5py re-runs itself with one that has it" \
  "$PY" -S scripts/make_linear_dump.py "$T/a.h5"
grep -q "lacks h5py, numpy: running it with $T/py" "$T/err" || bad "no note of the re-run: $(cat "$T/err")"
[ -s "$T/a.h5" ] || bad "the re-run wrote no dump"
QATCHECK_PYTHON=/nonexistent/python3 expect_exit 2 "without a usable interpreter: one line, exit 2" \
  "$PY" -S scripts/make_checkpoint.py "$T/b.h5"
[ "$(wc -l <"$T/err")" -eq 1 ] || bad "not one line: $(cat "$T/err")"
grep -q "make_checkpoint.py: error: needs h5py, numpy.*run it with /nonexistent/python3" "$T/err" || bad "$(cat "$T/err")"

REPO=$(pwd)
cp cases/linear_bf16.json "$T/lb.json"
(cd / && env -u QATCHECK "$PY" "$REPO/scripts/case-tol.py" "$T/lb.json" "d_x=--out-dtype bfloat16 --k 1024") >"$T/out" 2>"$T/err" \
  && ok "case-tol.py outside the repository" || bad "case-tol.py outside the repository: $(cat "$T/err")"
(cd / && env -u QATCHECK "$PY" "$REPO/scripts/case-tol.py" "$T/none.json" "d_x=--out-dtype bfloat16 --k 8") >"$T/out" 2>"$T/err"
[ $? -eq 2 ] && ! grep -q Traceback "$T/err" && grep -q "^case-tol.py: error: case '.*none.json': cannot read" "$T/err" \
  && ok "case-tol.py: a missing case is one line, exit 2" || bad "case-tol.py missing case: $(cat "$T/err")"

"$PY" -S -c "import sys; sys.path.insert(0, 'scripts'); import qatdump" >"$T/out" 2>"$T/err"
grep -q "qatdump needs torch, h5py and numpy.*/usr/bin/python3" "$T/err" && ok "qatdump names the interpreter" \
  || bad "qatdump import without packages: $(tail -2 "$T/err")"
finish
