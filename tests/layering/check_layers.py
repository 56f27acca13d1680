#!/usr/bin/env python3
"""Checks the house rules on the headers under include/dtrain/:

- every header includes only its own layer and the layers above it in docs/architecture.md's layer
  table (the table is the rule; this reads it). A path owns the headers under it that no longer
  path of the table owns, so `runtime/` holds what `runtime/engine/` and the other rooms do not.
  A header's own definitions (x_impl.hpp for x.hpp, beside it or in a detail/ room), which
  header-only builds include at its end, may sit in a later layer: the rule is about what a
  declaration needs;
- no header is longer than the limit: a header one reads whole, and pays for in every file that
  includes it, has one concern;
- no header under a --without-mpi folder reaches <mpi.h>, directly or through any chain of dtrain
  headers: such a folder is logic that can be tested, and reasoned about, without MPI.

usage: check_layers.py <include dir> <architecture.md> [--max-lines N (default 450)]
                       [--without-mpi FOLDER ...]
Exits 1 and names each offending include, each header over N lines and each chain to <mpi.h>."""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def layers_from_table(doc):
    """[(layer, [paths])] in table order; a path is a folder ("comm/") or a file ("cuda.hpp")."""
    layers = []
    in_table = False
    for line in doc.read_text().splitlines():
        if line.startswith("| layer |"):
            in_table = True
            continue
        if in_table and line.startswith("|---"):
            continue
        if in_table and line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            paths = re.findall(r"`([^`]+)`", cells[1])
            if not paths:
                sys.exit(f"check_layers: no paths in the layer table row {line!r}")
            layers.append((cells[0], paths))
        elif in_table:
            break
    if not layers:
        sys.exit(f"check_layers: no layer table ('| layer | ...') in {doc}")
    return layers


def layer_of(rel, layers):
    """Index of the layer that owns `rel` (a path relative to include/dtrain): the row with the
    longest path that is `rel` or a folder holding it; None when no row does."""
    best, best_len = None, -1
    for i, (_, paths) in enumerate(layers):
        for p in paths:
            if ((p.endswith("/") and rel.startswith(p)) or rel == p) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def own_definitions(rel, target):
    """Whether `target` holds the definitions of the header `rel`: x_impl.hpp for x.hpp."""
    return pathlib.PurePosixPath(target).name == pathlib.PurePosixPath(rel).stem + "_impl.hpp"


def includes(path):
    """[(line number, included path)] of one header."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            out.append((n, m.group(1)))
    return out


def chain_to_mpi(rel, graph, seen=None):
    """The dtrain headers from `rel` to one that includes <mpi.h>, or None."""
    seen = set() if seen is None else seen
    if rel in seen or rel not in graph:
        return None
    seen.add(rel)
    for _, target in graph[rel]:
        if target == "mpi.h":
            return [rel]
        if target.startswith("dtrain/"):
            rest = chain_to_mpi(target[len("dtrain/"):], graph, seen)
            if rest:
                return [rel] + rest
    return None


def main():
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("include_dir")
    p.add_argument("architecture")
    p.add_argument("--max-lines", type=int, default=450)
    p.add_argument("--without-mpi", action="append", default=[])
    args = p.parse_args()
    root = pathlib.Path(args.include_dir) / "dtrain"
    layers = layers_from_table(pathlib.Path(args.architecture))
    errors = []
    headers = sorted(root.rglob("*.hpp"))
    if not headers:
        sys.exit(f"check_layers: no headers under {root}")
    graph = {h.relative_to(root).as_posix(): includes(h) for h in headers}
    for h in headers:
        rel = h.relative_to(root).as_posix()
        lines = len(h.read_text().splitlines())
        if lines > args.max_lines:
            errors.append(f"{rel}: {lines} lines, over the {args.max_lines} a header may have: "
                          f"split it by concern")
        own = layer_of(rel, layers)
        if own is None:
            errors.append(f"{rel}: in no layer of the table; add its folder to the table")
            continue
        for n, included in graph[rel]:
            if not included.startswith("dtrain/"):
                continue
            included = included[len("dtrain/"):]
            target = layer_of(included, layers)
            if target is None:
                errors.append(f"{rel}:{n}: includes dtrain/{included}, which is in no layer")
            elif target > own and not own_definitions(rel, included):
                errors.append(
                    f"{rel}:{n}: layer '{layers[own][0]}' includes dtrain/{included} of layer "
                    f"'{layers[target][0]}', which comes after it in the table: a layer includes "
                    f"only itself and the layers above it")
    for folder in args.without_mpi:
        folder = folder.rstrip("/") + "/"
        owned = [rel for rel in graph if rel.startswith(folder)]
        if not owned:
            errors.append(f"--without-mpi {folder}: no headers there")
        for rel in owned:
            chain = chain_to_mpi(rel, graph)
            if chain:
                errors.append(f"{rel}: reaches <mpi.h> ({' -> '.join(chain)} -> mpi.h), but "
                              f"{folder} is logic without MPI")
    for e in errors:
        print(e)
    print(f"check_layers: {len(headers)} headers, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
