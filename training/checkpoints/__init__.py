"""Checkpoints and where a run starts from: Orbax saves and restores (checkpointer.py), the JSON item saved beside the
arrays (metadata.py), where a run's checkpoints and run directory are (locate.py), fresh / resume / init_from planning
(resume.py), the save path's lock, the storage checks, and a trained model loaded for scripts (trained.py). Imports
config/, distributed/ and step/."""
