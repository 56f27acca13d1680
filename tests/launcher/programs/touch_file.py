#!/usr/bin/env python3
"""Test program: creates the file named by its argument (proof that it ran)."""
import sys

open(sys.argv[1], "w").close()
