"""Entry point of one peer process: ``python child.py CONFIG_JSON`` (see common.py for the protocol)."""

from __future__ import annotations

import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    # first of all, before the peer's imports: the allocator of a long-running learner (common.py)
    cfg["malloc_ready"] = cfg.get("malloc", "learner") == "learner" and common.learner_malloc_state()
    module = importlib.import_module("peer_" + cfg["peer"])
    common.run(module.Peer, cfg)
