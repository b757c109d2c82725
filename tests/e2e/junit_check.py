#!/usr/bin/env python3
"""junit_check.py FILE...: each file is JUnit XML in the common schema CI
tools read (Jenkins' junit-10; GitLab and GitHub reporters accept it):
<testsuites> or <testsuite> at the root; a <testsuite> has name, tests,
failures and errors; a <testcase> has name, classname and time; only the
elements the schema allows, where it allows them; every count attribute
equals what the element holds; time attributes are decimal seconds; every
(classname, name) pair is unique in the file. Exit 1 naming the first
problem of each bad file."""
import re
import sys
import xml.etree.ElementTree as ET

TIME = re.compile(r"^(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]*)?$")   # the schema's SUREFIRE_TIME
CASE_CHILDREN = {"skipped", "error", "failure", "system-out", "system-err",
                 "rerunFailure", "rerunError", "flakyFailure", "flakyError"}
SUITE_CHILDREN = {"testsuite", "properties", "testcase", "system-out", "system-err"}


def integer(e, attr, where):
    v = e.get(attr)
    if v is None:
        raise ValueError(f"{where}: <{e.tag}> has no '{attr}' attribute")
    if not re.fullmatch(r"[0-9]+", v):
        raise ValueError(f"{where}: <{e.tag} {attr}='{v}'> is not a count")
    return int(v)


def time_ok(e, where, required):
    v = e.get("time")
    if v is None:
        if required:
            raise ValueError(f"{where}: <{e.tag}> has no 'time' attribute")
        return 0.0
    if not TIME.fullmatch(v) or v == "":
        raise ValueError(f"{where}: <{e.tag} time='{v}'> is not decimal seconds")
    return float(v.replace(",", "") or 0)


def check_case(c, where, seen):
    if not c.get("name"):
        raise ValueError(f"{where}: a <testcase> without a name")
    if c.get("classname") is None:
        raise ValueError(f"{where}: testcase '{c.get('name')}' has no classname")
    time_ok(c, where, True)
    for k in c:
        if k.tag not in CASE_CHILDREN:
            raise ValueError(f"{where}: <{k.tag}> is not allowed in a <testcase>")
        if k.tag in ("failure", "error") and k.get("message") is None:
            raise ValueError(f"{where}: a <{k.tag}> without a message in '{c.get('name')}'")
    key = (c.get("classname"), c.get("name"))
    if key in seen:
        raise ValueError(f"{where}: testcase classname='{key[0]}' name='{key[1]}' is not unique")
    seen.add(key)


def check_suite(s, where, seen):
    if not s.get("name"):
        raise ValueError(f"{where}: a <testsuite> without a name")
    tests, failures, errors = (integer(s, a, where) for a in ("tests", "failures", "errors"))
    time_ok(s, where, False)
    cases = [c for c in s if c.tag == "testcase"]
    for k in s:
        if k.tag not in SUITE_CHILDREN:
            raise ValueError(f"{where}: <{k.tag}> is not allowed in a <testsuite>")
        if k.tag == "testsuite":
            check_suite(k, where, seen)
    for c in cases:
        check_case(c, where, seen)
    nf = sum(1 for c in cases for k in c if k.tag == "failure")
    ne = sum(1 for c in cases for k in c if k.tag == "error")
    if (tests, failures, errors) != (len(cases), nf, ne):
        raise ValueError(f"{where}: testsuite '{s.get('name')}' says tests={tests} failures={failures} errors={errors}, "
                         f"holds {len(cases)}, {nf}, {ne}")
    return len(cases), nf, ne


def check(path):
    root = ET.parse(path).getroot()
    seen = set()
    if root.tag == "testsuite":
        return check_suite(root, path, seen)
    if root.tag != "testsuites":
        raise ValueError(f"{path}: the root is <{root.tag}>, expected <testsuites> or <testsuite>")
    time_ok(root, path, False)
    tot = [0, 0, 0]
    for s in root:
        if s.tag != "testsuite":
            raise ValueError(f"{path}: <{s.tag}> is not allowed in <testsuites>")
        for i, v in enumerate(check_suite(s, path, seen)):
            tot[i] += v
    for a, v in zip(("tests", "failures", "errors"), tot):
        if root.get(a) is not None and integer(root, a, path) != v:
            raise ValueError(f"{path}: <testsuites {a}='{root.get(a)}'> but the suites hold {v}")
    return tuple(tot)


def main():
    bad = 0
    for p in sys.argv[1:]:
        try:
            t, f, e = check(p)
            print(f"ok   {p}: {t} testcases, {f} failures, {e} errors, names unique")
        except (ValueError, ET.ParseError) as x:
            print(f"FAIL {x}")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
