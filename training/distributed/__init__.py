"""Devices and processes: the mesh, how the state and batches are laid out on it (dp, fsdp, tensor parallel), the
start of a multi-process run, and the watch that names a process that died. Imports nothing of training/."""
