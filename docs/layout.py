#!/usr/bin/python3
"""layout.py — writes docs/layout.md, every tracked source with its one-line description.

Each source says what it is in its opening comment, so the list of files cannot drift from
the files: a C, header or CUDA file opens with `/*` and ` * name.c — what it is.` (or
`// name.cu — ...`), a script or config file with its first comment or docstring. The
description is that comment's first sentence.

  docs/layout.py            print the layout to stdout
  docs/layout.py --write    rewrite docs/layout.md (make layout)
  docs/layout.py --check    fail when docs/layout.md is stale, a source has no opening
                            line, or a Markdown file (README.md, docs/, proto/, ...)
                            links to a file that is not there or names one in
                            backticks, `server/loop.c` (make layout-check, part of
                            make test)

Debian's python3 and the standard library only: it runs before any venv exists.
"""

import os
import re
import subprocess
import sys

OUT = "docs/layout.md"
C_FAMILY = (".c", ".h", ".cu", ".cuh", ".js", ".css")
# Not sources: documentation, images, and the fuzzers' seed inputs (data, one folder a target).
SKIP = re.compile(r"(\.md$|\.png$|^\.gitignore$|^tests/fuzz/[^/]+/)")
DASH = " — "


def tracked():
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("layout: git ls-files failed (%s): run it in a git checkout" % out.stderr.strip())
    return [p for p in out.stdout.splitlines() if not SKIP.search(p)]


def c_comment(lines):
    """The text of the opening /* */ or // comment, as one string."""
    if not lines:
        return None
    if lines[0].startswith("//"):
        body = []
        for ln in lines:
            if not ln.startswith("//") or (body and not ln[2:].strip()):
                break
            body.append(ln[2:].strip())
        return " ".join(body)
    if not lines[0].startswith("/*"):
        return None
    body = []
    for ln in lines:
        end = "*/" in ln
        ln = ln.split("*/")[0]
        ln = re.sub(r"^\s*/?\*+", "", ln).strip()
        if ln:
            body.append(ln)
        elif body:
            break  # the first paragraph is enough
        if end:
            break
    return " ".join(body)


def hash_comment(lines, lead):
    """The first comment of a script or config file (after a shebang and a doctype)."""
    body = []
    for ln in lines:
        if not body and (ln.startswith("#!") or ln.startswith("<!DOCTYPE")):
            continue
        if ln.startswith("<!--"):
            return ln[4:].split("-->")[0].strip()
        if ln.startswith(lead) and ln[len(lead) :].strip():
            body.append(ln[len(lead) :].strip())
        elif body or ln.strip():
            break
    return " ".join(body) or None


def docstring(lines):
    text = "\n".join(ln for ln in lines if not ln.startswith("#!"))
    m = re.match(r'\s*(?:[rb]?)("""|\'\'\')(.*?)\1', text, re.S)
    if m:
        return " ".join(m.group(2).strip().split("\n\n")[0].split())
    return hash_comment(lines, "#")


def first_sentence(text):
    text = " ".join(text.split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)(?<! vs)(?<! cf)\.(?=\s|$)", text)
    text = text[: m.end()] if m else text
    return text[:-1] + "." if text.endswith(":") else text  # a list followed


def describe(path):
    """(description, problem): the file's first sentence, or why it has none."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()[:60]
    except (UnicodeDecodeError, OSError) as e:
        return None, "unreadable (%s)" % e
    name = os.path.basename(path)
    if path.endswith(C_FAMILY):
        text = c_comment(lines)
        if text is None:
            return None, "does not open with a comment"
        if not text.startswith(name + DASH):
            return None, "its opening comment does not start with '%s — '" % name
        text = text[len(name + DASH) :]
    elif path.endswith(".py"):
        text = docstring(lines)
    elif path.endswith(".lua"):
        text = hash_comment(lines, "--")
    else:
        text = hash_comment(lines, "#")
    if not text:
        return None, "has no opening comment"
    # "name — ", "path/name — " or "path/name ARGS — " (a script's usage)
    m = re.match(r"(\S*/)?%s( [A-Z. ]+)?%s" % (re.escape(name), DASH), text)
    if m:
        text = text[m.end() :]
    return first_sentence(text), None


def pair(desc):
    """'see args.h.' names the header that describes this file."""
    m = re.match(r"see (\S+?\.h)\b", desc)
    return m.group(1) if m else None


def render(paths):
    descs, problems = {}, []
    for p in paths:
        d, why = describe(p)
        if why:
            problems.append("%s: %s" % (p, why))
        else:
            descs[p] = d
    folders = {}
    for p in sorted(descs):
        folders.setdefault(os.path.dirname(p) or ".", []).append(p)
    out = [
        "# Layout",
        "",
        "Every tracked source by folder, with the first sentence of its opening comment.",
        "Generated by `make layout` (docs/layout.py); `make test` fails when it is stale.",
        "",
    ]
    for folder in sorted(folders, key=lambda f: (f != ".", f)):
        out += ["## %s" % ("(top)" if folder == "." else folder + "/"), ""]
        shown = set()
        for p in folders[folder]:
            if p in shown:
                continue
            name, desc = os.path.basename(p), descs[p]
            header = pair(desc)
            hp = os.path.join(folder, header) if header else None
            if hp in descs and hp != p:
                shown.add(hp)
                hname = os.path.basename(hp)
                out.append("- [`%s`](../%s), [`%s`](../%s) — %s" % (hname, hp, name, p, descs[hp]))
                continue
            out.append("- [`%s`](../%s) — %s" % (name, p, desc))
        out.append("")
    return "\n".join(out), problems


LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path in backticks that names a file of the tree, e.g. `server/loop.c`.
NAMED = re.compile(r"`((?:\.ci|clients|docker|docs|engine|proto|server|tests)/[\w./-]*\w\.\w+)`")


def broken_links(skip=None):
    """Relative links and backticked paths in the Markdown files that point at nothing."""
    out = subprocess.run(["git", "ls-files", "*.md"], capture_output=True, text=True)
    docs = set(out.stdout.split()) | {"README.md"}
    docs |= {os.path.join("docs", f) for f in os.listdir("docs") if f.endswith(".md")}
    docs = sorted(d for d in docs if os.path.exists(d) and d != skip)
    bad = []
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target.split("#")[0]))
            if path.startswith("..") or not os.path.exists(path):
                bad.append("%s: a link to no file: %s" % (doc, target))
        if doc != OUT:
            for path in NAMED.findall(text):
                if not os.path.exists(path):
                    bad.append("%s: names %s, which is not in the tree" % (doc, path))
    return bad


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    text, problems = render(tracked())
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    for p in problems:
        print("layout: %s" % p, file=sys.stderr)
    if problems:
        print("layout: give each file listed above an opening comment", file=sys.stderr)
        print("layout: (C: /* then ' * name.c — what it is.')", file=sys.stderr)
        return 1
    if mode == "--write":
        with open(OUT, "w", encoding="utf-8") as f:
            f.write(text)
        return 0
    if mode != "--check":
        sys.stdout.write(text)
        return 0
    status = 0
    try:
        with open(OUT, encoding="utf-8") as f:
            stale = f.read() != text
    except OSError:
        stale = True
    if stale:
        print("%s is stale: run make layout" % OUT, file=sys.stderr)
        status = 1
    for b in broken_links(skip=OUT if stale else None):
        print("layout: %s" % b, file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
