"""Tools on runs and checkpoints: `python -m scripts.tools.<name> --help`."""
