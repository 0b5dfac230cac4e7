"""``python -m mmreplay``: the ``mmreplay`` command (same subcommands, options and exit codes)."""

from __future__ import annotations

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
