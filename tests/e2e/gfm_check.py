#!/usr/bin/env python3
"""gfm_check.py FILE.md [MIN_TABLES]: the Markdown is GitHub-flavoured
Markdown whose tables render as tables: every table is a header row, a
delimiter row (---, :---, ---: or :---:) with as many cells, and body rows
with exactly as many cells (a pipe inside a cell escaped as \\|, code spans
closed within their cell); a table starts after a blank line; headings are
'#' to '######' and a space; the document starts with a level-1 heading.
Prints the number of tables; exit 1 naming the first problem."""
import re
import sys

DELIM = re.compile(r"^:?-{3,}:?$")


def cells(line):
    """Split a table row on its unescaped pipes (GFM: '\\|' stays in the cell)."""
    s = line.strip()
    if not (s.startswith("|") and s.endswith("|")) or s.endswith("\\|"):
        return None
    out, cur, i = [], "", 1
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s):
            cur += s[i:i + 2]
            i += 2
            continue
        if ch == "|":
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    return out


def check(path, min_tables):
    lines = open(path, encoding="utf-8").read().split("\n")
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"{path}:1: the document does not start with a level-1 heading")
    tables, i, fence = 0, 0, False
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("```"):
            fence = not fence
        if fence:
            i += 1
            continue
        if ln.startswith("#") and not re.match(r"^#{1,6} \S", ln):
            raise ValueError(f"{path}:{i + 1}: a heading needs 1-6 '#' and a space: {ln[:60]!r}")
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        head, delim = cells(ln), cells(nxt)
        if head is not None and delim is not None and delim and all(DELIM.match(c) for c in delim):
            if len(head) != len(delim):
                raise ValueError(f"{path}:{i + 1}: header has {len(head)} cells, delimiter row {len(delim)}")
            if i > 0 and lines[i - 1].strip():
                raise ValueError(f"{path}:{i + 1}: a table must follow a blank line")
            j = i + 2
            while j < len(lines) and lines[j].strip():
                row = cells(lines[j])
                if row is None:
                    raise ValueError(f"{path}:{j + 1}: a row inside a table that is not a table row: {lines[j][:60]!r}")
                if len(row) != len(head):
                    raise ValueError(f"{path}:{j + 1}: {len(row)} cells, the header has {len(head)}: {lines[j][:80]!r}")
                for c in row:
                    if len(re.findall(r"(?<!\\)`", c)) % 2:
                        raise ValueError(f"{path}:{j + 1}: an unclosed code span in cell {c[:40]!r}")
                j += 1
            tables += 1
            i = j
            continue
        if head is not None and ln.strip().startswith("|") and (i == 0 or not lines[i - 1].strip().startswith("|")):
            raise ValueError(f"{path}:{i + 1}: a table row without a header and delimiter row: {ln[:60]!r}")
        i += 1
    if tables < min_tables:
        raise ValueError(f"{path}: {tables} table(s), expected at least {min_tables}")
    return tables


if __name__ == "__main__":
    try:
        n = check(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
        print(f"ok   {sys.argv[1]}: {n} GFM table(s), every row as wide as its header")
    except ValueError as e:
        print(f"FAIL {e}")
        sys.exit(1)
