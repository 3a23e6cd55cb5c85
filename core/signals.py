"""Stop signals a process received outside a training loop, which the next loop must honour.

A sweep (training/cli/app.py) takes SIGTERM and SIGINT itself between its jobs and while one starts, raising
KeyboardInterrupt as Ctrl-C does, and notes each here: a job's set-up may lose that KeyboardInterrupt on its way out
(a library's `except`, a finalizer's "Exception ignored"), and the job's loop (training/loop/signals.py) then stops
after its first step, with a checkpoint, as if it had received the signal itself.
"""

from __future__ import annotations

pending: list[str] = []  # the signals' names, in the order received; cleared when the sweep's command ends
