"""hf_report.py WANT_T DIR WANT [DIR WANT]...: the report check of
tests/e2e/hf_models.sh and hf_models5.sh (qatdump_hf's models audited by
`vjp`). For each DIR: every module of DIR/plan.json was checked, each
quantized linear's deployed bytes reproduced, and the failed checks exactly
the planted module's (WANT 1) or none (WANT 0), on the tensors its bug
reaches: WANT_T, a JSON object {plant: [[tensor, ...], ...]} of the allowed
sorted lists (a plant not named: none). One python for every DIR (its start
costs more than a check); prints one ok / FAIL line per DIR and exits with
the count of DIRs that fail."""
import json
import re
import sys


def check(d, want, want_by_plant):
    plan = json.load(open(d + "/plan.json"))
    r = json.load(open(d + "/r.json"))
    mods = {"/" + m for m in plan["modules"]}
    checked = {c["module"] for c in r["checks"]}
    failed = {c["module"] for c in r["checks"] if c["verdict"] != "pass"}
    expect = {"/" + plan["planted"]} if want == "1" and plan["planted"] else set()
    if d.endswith("_g2_tile"):  # the library's own grouping: every ssd module, nothing else
        expect = {m for m in mods if m.endswith(".qc_ssd")}
    errs = []
    # the planted module fails on the gradients its bug reaches
    tens = sorted(c["tensor"] for c in r["checks"] if c["verdict"] != "pass")
    plant = d.rsplit("/", 1)[-1]
    if plant.endswith("_bf16"):  # the same plant in a pure-bf16 model
        plant = plant[:-5]
    want_t = want_by_plant.get(plant, [[]])
    if plant.endswith("_g2_tile"):
        want_t = [sorted(["d_A", "d_Bm", "d_Cm", "d_dt", "d_x", "y"] * 2)]  # y: the forward check sees it too
    if tens not in want_t:
        errs.append("failed tensors %s, expected one of %s" % (tens, want_t))
    # each quantized linear's deployed bytes are checked against qatcheck's quantizer
    quant = {c["module"] for c in r["checks"] if c["tensor"] == "quantizer" and c["verdict"] == "pass"}
    qlin = {"/" + m for m, c in plan["modules"].items() if c == "linear" and not re.search(r"(^lm_head|\.gate)$", m)}
    if quant != qlin:
        errs.append("quantizer checks passed on %d modules, expected the %d quantized linears" % (len(quant), len(qlin)))
    if mods - checked:
        errs.append("not checked: %s" % sorted(mods - checked))
    if failed != expect:
        errs.append("failed modules %s, expected %s" % (sorted(failed), sorted(expect)))
    print(("FAIL " if errs else "ok   ") + "%s: %d modules, %d checks, failed %s" % (
        d.rsplit("/", 1)[-1], len(mods), len(r["checks"]),
        sorted("%s %s" % (c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] != "pass") or "none")
        + "".join("; " + e for e in errs))
    return 1 if errs else 0


def guarded(d, want, want_by_plant):
    try:
        return check(d, want, want_by_plant)
    except Exception as e:  # an unreadable report fails its DIR, not the others
        print("FAIL %s: %s" % (d.rsplit("/", 1)[-1], e))
        return 1


if __name__ == "__main__":
    wt = json.loads(sys.argv[1])
    sys.exit(sum(guarded(sys.argv[i], sys.argv[i + 1], wt) for i in range(2, len(sys.argv), 2)))
