#!/usr/bin/env python3
"""Test program: prints, as one JSON line, its rank and the values of the named variables
(null when unset)."""
import json
import os
import sys

rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
print(json.dumps({"rank": rank, "env": {name: os.environ.get(name) for name in sys.argv[1:]}}))
