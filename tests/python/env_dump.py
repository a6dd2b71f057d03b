"""Writes the environment variables a launcher gives its workers (torchrun's and the ones it sets
for Python, OpenMP and NCCL) to DIR/env-<RANK>.json, to compare launchers."""
import json
import os
import sys

PREFIXES = ("TORCH", "RANK", "LOCAL_", "WORLD", "GROUP_", "ROLE_", "MASTER_", "NCCL_", "OMP_", "PYTHONUNBUFFERED")
with open(os.path.join(sys.argv[1], "env-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}, f, indent=1, sort_keys=True)
