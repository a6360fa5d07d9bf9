"""Rows whose tokens agree between two probe.py runs' tokens.json: python compare.py A B"""
import json
import sys

import gpu_e2e_bench as e2e

a, b = (json.load(open(p)) for p in sys.argv[1:3])
for kv in a:
    print(kv, e2e.agreement(a[kv], b[kv]), "distinct tokens", len({t for row in a[kv] for t in row}))
