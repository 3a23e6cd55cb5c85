"""The command line: Hydra's application with the project's one-line errors and exit codes (app.py), argv to
overrides, and sweeps' job directories and summary. Imports config/, distributed/, checkpoints/ and reporting/."""
