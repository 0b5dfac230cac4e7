"""The ``mmreplay`` command line (``main``) and its groups of commands, each in its own module (layer 8)."""
