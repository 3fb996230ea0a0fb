#!/usr/bin/env python3
"""circles.py — no call circle between the product's source files.

A call circle is a set of files each of which, through the others, calls
back into itself: a.c calls b.c and b.c calls a.c (or through c.c). Such
files cannot be read, tested or replaced one at a time, so the tree keeps
none. The check reads what the linker reads: `nm` over the objects of
every product source (tests/ left out) gives, per file, the symbols it
defines and those it uses; a file calls another when it uses a symbol the
other defines. The include graph of the product's headers is checked the
same way (a header that includes, through others, itself), and so is a
header that uses a name defined in a .c file that includes it (the .c and
its header then lean on each other inside one object, where nm cannot see).

Usage: tests/circles.py BUILD_DIR   (the objects under BUILD_DIR/obj/)
Exit 0 with "no call circles" and the counts, or 1 naming every circle
and the symbols that tie it.
"""
import os
import re
import subprocess
import sys

PRODUCT = ("engine/", "proto/", "server/", "clients/")


def objects(build):
    root = os.path.join(build, "obj")
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".o"):
                path = os.path.join(d, f)
                src = os.path.relpath(path, root)[:-2]
                # an object left by a source since moved, deleted or changed
                # is not the tree's (a CUDA=0 build keeps an older nvcc build's)
                live = [src + e for e in (".c", ".cu") if os.path.exists(src + e)]
                fresh = live and os.path.getmtime(path) >= os.path.getmtime(live[0])
                if src.startswith(PRODUCT) and fresh:
                    yield src, path


def symbols(path):
    out = subprocess.run(["nm", "-g", path], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] not in "Uvw":
            defined.add(parts[2])
    return defined, used


def call_graph(build):
    owner, uses = {}, {}
    for src, path in sorted(objects(build)):
        defined, used = symbols(path)
        for s in defined:
            owner.setdefault(s, src)
        uses[src] = used
    graph = {src: {} for src in uses}
    for src, used in uses.items():
        for s in used:
            dst = owner.get(s)
            if dst and dst != src:
                graph[src].setdefault(dst, set()).add(s)
    return graph


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def include_graph():
    files = []
    for top in PRODUCT:
        for d, _, names in os.walk(top):
            files += [os.path.join(d, n) for n in names if n.endswith((".h", ".cuh"))]
    by_name = {}
    for f in files:
        by_name.setdefault(os.path.basename(f), []).append(f)
    graph = {f: {} for f in files}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            near = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            dst = near if near in graph else None
            if not dst and len(by_name.get(os.path.basename(inc), [])) == 1:
                dst = by_name[os.path.basename(inc)][0]
            if dst and dst != f:
                graph[f].setdefault(dst, set()).add("#include")
    return graph


# What a file declares or defines at its top level (column 0).
DECLARES = re.compile(r"^(?:#\s*define\s+(\w+)|[A-Za-z_][\w \t\*]*?\b(\w+)\s*\(|\}\s*(\w+)\s*;)", re.M)
DEFINES = re.compile(
    r"^(?:#\s*define\s+(\w+)"                      # a macro
    r"|(?:static\s+|inline\s+|const\s+)*[A-Za-z_][\w \t\*]*?\b(\w+)\s*\([^;]*$"  # a function
    r"|\}\s*(\w+)\s*;"                             # the name of a typedef'd struct
    r"|(?:static\s+)?(?:const\s+)?\w+[\s\*]+(\w+)\s*(?:\[[^\]]*\])*\s*=)",  # a variable
    re.M)
# Names a header declares as members, variables or parameters.
MEMBERS = re.compile(r"(?:\b(?!return\b)[\w\*]+[\s\*]+|,\s*\**\s*|\(\s*\*\s*)(\w+)\s*(?:\[[^\]]*\])*\s*(?=[;,=)\[])")
ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)\s*|^\s*#\s*include.*$", re.M)
WORD = re.compile(r"\b[A-Za-z_]\w*\b")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


# A build switch's default (#ifndef X / #define X 0) sets a header's
# option, as -DX=1 does: the header reads it, it does not call into the file.
SWITCH = re.compile(r"^\s*#\s*ifndef\s+(\w+)\s*\n\s*#\s*define\s+\1\b", re.M)


def defined_in(text):
    names = {n for m in DEFINES.finditer(text) for n in m.groups() if n}
    return names - set(SWITCH.findall(text))


def header_use_graph(includes):
    """A header -> the .c files including it whose own definitions it uses."""
    graph = {}
    for top in PRODUCT:
        for d, _, names in os.walk(top):
            for n in names:
                if not n.endswith((".c", ".cu")):
                    continue
                c = os.path.join(d, n)
                with open(c, encoding="utf-8") as fh:
                    text = COMMENT.sub("", fh.read())
                defs = defined_in(text) - {"if", "for", "while", "switch", "return", "sizeof"}
                for inc in INCLUDE.findall(text):
                    h = os.path.normpath(os.path.join(d, inc))
                    if h not in includes:
                        continue
                    with open(h, encoding="utf-8") as fh:
                        htext = ATTRIBUTE.sub("", COMMENT.sub("", fh.read()))
                    own = {n for m in DECLARES.finditer(htext) for n in m.groups() if n}
                    own |= set(MEMBERS.findall(htext))
                    tie = (set(WORD.findall(htext)) & defs) - own
                    if tie:
                        graph.setdefault(h, {})[c] = tie
                        graph.setdefault(c, {})[h] = {"#include"}
    return graph


def circles(graph):
    """Tarjan's strongly connected components of more than one file."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def report(kind, graph):
    found = circles(graph)
    for comp in found:
        print(f"{kind} circle: {', '.join(comp)}")
        for a in comp:
            for b in comp:
                if b in graph[a]:
                    names = sorted(graph[a][b])
                    more = f", and {len(names) - 6} more" if len(names) > 6 else ""
                    print(f"  {a} -> {b}: {', '.join(names[:6])}{more}")
    return len(found)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    calls = call_graph(sys.argv[1])
    if not calls:
        sys.exit(f"circles: no product objects under {sys.argv[1]}/obj: build first")
    includes = include_graph()
    n = report("call", calls) + report("include", includes)
    n += report("header", header_use_graph(includes))
    if n:
        print(f"circles: {n} circle(s) above; make the calls run one way", flush=True)
        sys.exit(1)
    print(f"circles: no call circles ({len(calls)} objects, "
          f"{len(includes)} headers checked)")


if __name__ == "__main__":
    main()
