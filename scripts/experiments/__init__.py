"""The research studies behind the presets and docs/: `python -m scripts.experiments.<name> --help`."""
