"""Checkpoints and where a run starts from: Orbax saves and restores (checkpointer.py), fresh / resume / init_from
planning and the run directory (resume.py), the save path's lock, the storage checks, and a trained model loaded for
scripts (trained.py). Imports config/, distributed/ and step/."""
