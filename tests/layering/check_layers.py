#!/usr/bin/env python3
"""Checks that every header under include/dtrain/ includes only its own layer and the layers
above it in docs/architecture.md's layer table (the table is the rule; this reads it), and that
no header is longer than the house's limit: a header one reads whole, and pays for in every file
that includes it, has one concern.

usage: check_layers.py <include dir> <architecture.md> [--max-lines N (default 450)]
Exits 1 and names each offending include when a lower layer includes a higher one, and each
header over N lines."""
import pathlib
import re
import sys


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
    """Index of the layer that owns `rel` (a path relative to include/dtrain), or None."""
    for i, (_, paths) in enumerate(layers):
        for p in paths:
            if (p.endswith("/") and rel.startswith(p)) or rel == p:
                return i
    return None


def main():
    args = sys.argv[1:]
    max_lines = 450
    if len(args) == 4 and args[2] == "--max-lines" and args[3].isdigit():
        max_lines = int(args[3])
        args = args[:2]
    if len(args) != 2:
        sys.exit(__doc__)
    root = pathlib.Path(args[0]) / "dtrain"
    layers = layers_from_table(pathlib.Path(args[1]))
    include = re.compile(r'^\s*#\s*include\s*[<"]dtrain/([^>"]+)[>"]')
    errors = []
    headers = sorted(root.rglob("*.hpp"))
    if not headers:
        sys.exit(f"check_layers: no headers under {root}")
    for h in headers:
        rel = h.relative_to(root).as_posix()
        own = layer_of(rel, layers)
        if own is None:
            errors.append(f"{rel}: in no layer of the table; add its folder to the table")
            continue
        lines = h.read_text().splitlines()
        if len(lines) > max_lines:
            errors.append(f"{rel}: {len(lines)} lines, over the {max_lines} a header may have: "
                          f"split it by concern")
        for n, line in enumerate(lines, 1):
            m = include.match(line)
            if not m:
                continue
            target = layer_of(m.group(1), layers)
            if target is None:
                errors.append(f"{rel}:{n}: includes dtrain/{m.group(1)}, which is in no layer")
            elif target > own:
                errors.append(
                    f"{rel}:{n}: layer '{layers[own][0]}' includes dtrain/{m.group(1)} of layer "
                    f"'{layers[target][0]}', which comes after it in the table: a layer includes "
                    f"only itself and the layers above it")
    for e in errors:
        print(e)
    print(f"check_layers: {len(headers)} headers, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
