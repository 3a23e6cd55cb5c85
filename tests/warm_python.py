"""A Python that has imported the project once and forks a process per command, for the tests' `python train_jax.py
...`, `python -m scripts...` and `python -c ...` commands (helpers.spawn).

A fresh interpreter spends 1.3-3 s on a train_jax command before it reads its arguments: importing jax, equinox,
optax, orbax, Hydra, datasets and the project (1,700 modules), compiling the project's bytecode where
PYTHONDONTWRITEBYTECODE is set, discovering Hydra's plugins. The suite starts about a hundred such commands. Here one
process per test worker pays that once (`preload`), then forks: the child takes the command's arguments, environment,
working directory and standard streams, leads a process group of its own, and runs the command as `__main__`, as
`python` would; its exit code and signals are its own, and its parent waits for it and reports its status.

What a fork cannot give a command, it does not get: a command whose environment differs in what is read at import
(JAX's config flags, Python's, Hugging Face's, thread pools'), or that sets `preexec_fn`, or that could import the
project from elsewhere, runs in a fresh interpreter as before (`eligible`). Forking is safe here because the preloaded
process has not started JAX's backend (no XLA threads; `serve` checks) and no Python thread.

Run as `python tests/warm_python.py SOCKET`: it preloads, listens on the Unix socket, prints `ready`, and exits when
its standard input closes (its test worker has gone).
"""

from __future__ import annotations

import atexit
import io
import json
import locale
import os
import select
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN_JAX = str(ROOT / "train_jax.py")
PACKAGES = ("train_jax", "training", "models", "optimizers", "data", "core", "scripts", "conf")
# Read when a module is imported (so a preloaded process has them already), not when a command runs: a command whose
# environment changes one of these starts a fresh interpreter. Also every JAX config flag (JAX_<FLAG>).
IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS",
    "TORCH",
    "TF_",
    "OMP_",
    "MKL_",
    "OPENBLAS",
    "LD_",
    "MALLOC",
)
MESSAGE_BYTES = 1 << 20


# ---- the warm process ----------------------------------------------------------------------------------------------


def preload() -> None:
    """What every command would import and initialise first: the project and its packages, Hydra's plugins and the
    config store (one composition)."""
    import train_jax  # noqa: F401  (jax, equinox, optax, orbax, hydra, datasets and the project)
    from training.config.compose import compose_config

    compose_config([])


def serve(path: str) -> dict | None:
    """Accept commands on `path` until standard input closes; in a forked child, return its request (the caller runs
    it); in the server, never return."""
    import jax._src.xla_bridge as xla_bridge

    assert not xla_bridge._backends, "a warm Python must not have started JAX's backend: its children would share it"
    assert threading.active_count() == 1, f"a warm Python must have no Python thread: {threading.enumerate()}"
    import gc

    gc.freeze()  # the preloaded objects: never scanned again, in the server or its children
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ, "accept")
    events.register(sys.stdin, selectors.EVENT_READ, "parent")
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # pidfd -> the connection its command came on
    while True:
        for key, _ in events.select():
            if key.data == "parent":
                if not sys.stdin.buffer.read1(1 << 16):
                    os._exit(0)  # the test worker has gone; its commands are killed with their groups
            elif key.data == "accept":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
                request = json.loads(message)
                sys.stdout.flush()
                sys.stderr.flush()
                settled, has_settled = os.pipe()
                pid = os.fork()
                if pid == 0:
                    events.close()
                    listener.close()
                    for other in waiting.values():
                        other.close()
                    conn.close()
                    os.close(settled)
                    _become(request, fds)
                    os.close(has_settled)  # as Popen returns: once the command's group and streams are its own
                    return request
                for fd in (*fds, has_settled):
                    os.close(fd)
                os.read(settled, 1)
                os.close(settled)
                conn.send(json.dumps({"pid": pid}).encode())
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = conn
                events.register(pidfd, selectors.EVENT_READ, pid)
            else:
                pidfd, pid = key.fd, key.data
                _, status = os.waitpid(pid, 0)
                events.unregister(pidfd)
                os.close(pidfd)
                conn = waiting.pop(pidfd)
                try:
                    conn.send(json.dumps({"status": status}).encode())
                except OSError:
                    pass  # the test stopped waiting for it
                conn.close()


def _become(request: dict, fds: list[int]) -> None:
    """In the forked child: the command's process group, streams, directory, environment and arguments."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    # sys.path[0] as `python script.py` (the script's folder), `python -m module` (the working directory) or
    # `python -c code` (the empty string: the working directory, wherever it is then) sets it
    sys.path[0] = str(Path(request["script"]).parent) if request["script"] else "" if request["code"] else os.getcwd()
    if request["code"] is None:
        # a fresh interpreter imports the command's module only as __main__: let nothing find the preloaded one instead
        sys.modules.pop(request["module"] or "train_jax", None)


def run(request: dict) -> None:
    """The command, as `python` runs it: as `__main__`; an exception or SystemExit ends the process as it would."""
    import runpy

    if request["script"]:
        runpy.run_path(request["script"], run_name="__main__")
    elif request["module"]:
        runpy._run_module_as_main(request["module"])  # what `python -m` calls (its errors, sys.argv[0], sys.path)
    else:
        _run_code(request["code"])


def _run_code(code: str) -> None:
    """`python -c code`: the code in a module `__main__` of its own; an exception's traceback starts in the code, as
    the interpreter prints it, and exits 1."""
    import builtins
    import traceback
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except Exception as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # without this function's frame
        sys.exit(1)


# ---- the test worker's side ----------------------------------------------------------------------------------------


def import_time_variable(name: str) -> bool:
    """An environment variable that a preloaded process has already read (so a command cannot change it by fork)."""
    import jax

    return name.startswith(IMPORT_TIME_PREFIXES) or name.lower() in jax.config.values


class WarmPython:
    """One warm process per test worker, started at its first command."""

    def __init__(self) -> None:
        self.server: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.path = ""
        self.folder: str | None = None  # the socket's and the server's log

    def eligible(self, command: list[str], env: dict[str, str], cwd: Path, popen: dict) -> dict | None:
        """The request for `command` if a fork of the warm process (its environment `self.env`) runs it as a fresh
        interpreter would, else None."""
        options = {k for k, v in popen.items() if v is not None}
        if len(command) < 2 or command[0] != sys.executable or options - {"stdin", "stdout", "stderr", "text"}:
            return None
        if command[1] == TRAIN_JAX:
            script, module, code, argv = TRAIN_JAX, None, None, [TRAIN_JAX, *command[2:]]
        elif command[1] in ("-m", "-c") and len(command) > 2:
            if command[1] == "-m" and not command[2].startswith("scripts."):
                return None
            if any((Path(cwd) / package).exists() for package in PACKAGES):
                return None  # `-m` and `-c` import from the working directory first: perhaps another project copy
            script, module, code = None, None, None
            if command[1] == "-m":
                module, argv = command[2], [command[2], *command[3:]]
            else:
                code, argv = command[2], ["-c", *command[3:]]
        else:
            return None
        if any(import_time_variable(k) for k in set(env) | set(self.env) if env.get(k) != self.env.get(k)):
            return None
        return {"argv": argv, "script": script, "module": module, "code": code, "env": env, "cwd": str(cwd)}

    def start(self, env: dict[str, str], cwd: Path) -> None:
        folder = tempfile.mkdtemp(prefix="warm-python-")
        self.path = os.path.join(folder, "socket")
        if self.folder is None:
            atexit.register(self.stop)  # with the test worker
        self.folder = folder
        self.env = dict(env)
        self.server = subprocess.Popen(
            [sys.executable, __file__, self.path],
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(os.path.join(folder, "server.log"), "wb"),  # noqa: SIM115  (the server's own, for its life)
        )
        ready, _, _ = select.select([self.server.stdout], [], [], 120)
        line = self.server.stdout.readline() if ready else b""
        if line != b"ready\n":
            self.server.kill()
            log = Path(folder, "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the warm Python did not start: {line!r}\n{log}")

    def spawn(self, command: list[str], env: dict[str, str], base_env: dict[str, str], cwd: Path, **popen):
        """`command` (environment `env`) forked from the warm process, or None where it must start a fresh
        interpreter. The warm process starts at the first command, with `base_env`: a command's environment without
        what the test adds; it starts again when that has changed in what is read at import (an import in the test
        worker that sets TF_CPP_MIN_LOG_LEVEL, say)."""
        if self.server is not None and (self.server.poll() is not None or self._stale(base_env)):
            self.stop()
        if self.server is None:
            self.env = dict(base_env)
            if self.eligible(command, env, cwd, popen) is None:
                return None  # not worth starting for
            self.start(base_env, cwd)
        request = self.eligible(command, env, cwd, popen)
        return None if request is None else Forked(command, request, self.path, popen)

    def _stale(self, base_env: dict[str, str]) -> bool:
        return any(import_time_variable(k) for k in set(base_env) | set(self.env) if base_env.get(k) != self.env.get(k))

    def stop(self) -> None:
        """End the warm process (the commands it forked go on: each is killed with its own group)."""
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server.stdin.close()
            self.server.stdout.close()
            self.server = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _stream(spec, mode: str):
    """(the fd the child gets, our end of a pipe or None, an fd to close after the fork or None)."""
    if spec == subprocess.PIPE:
        read, write = os.pipe()
        return (read, os.fdopen(write, "wb"), read) if mode == "r" else (write, os.fdopen(read, "rb"), write)
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        return fd, None, fd
    if spec is None:
        return {"r": 0, "w": 1}[mode], None, None
    if spec == subprocess.STDOUT:
        return None, None, None  # filled in by the caller: the child's stdout
    return (spec if isinstance(spec, int) else spec.fileno()), None, None


class Forked:
    """A command forked by the warm Python, with the parts of subprocess.Popen that tests use: args, pid,
    returncode, stdin/stdout/stderr, poll, wait, communicate, send_signal, terminate, kill."""

    def __init__(self, args: list[str], request: dict, path: str, popen: dict) -> None:
        self.args = args
        self.returncode: int | None = None
        self._text = bool(popen.get("text"))
        child_in, self.stdin, close_in = _stream(popen.get("stdin"), "r")
        child_out, stdout, close_out = _stream(popen.get("stdout"), "w")
        child_err, stderr, close_err = _stream(popen.get("stderr"), "w")
        if child_err is None:  # stderr=STDOUT
            child_err = child_out
        self.stdout = self._wrap(stdout)
        self.stderr = self._wrap(stderr)
        if self.stdin is not None and self._text:
            self.stdin = io.TextIOWrapper(self.stdin, write_through=True, line_buffering=True)
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._conn.connect(path)
        socket.send_fds(self._conn, [json.dumps(request).encode()], [child_in, child_out, child_err])
        for fd in filter(lambda fd: fd is not None, {close_in, close_out, close_err}):
            os.close(fd)
        self.pid = json.loads(self._conn.recv(MESSAGE_BYTES))["pid"]
        self._output: dict[str, list] = {}
        self._readers: list[threading.Thread] = []

    def _wrap(self, pipe):
        if pipe is None or not self._text:
            return pipe
        return io.TextIOWrapper(pipe, encoding=locale.getpreferredencoding(False))

    def poll(self) -> int | None:
        self._reap(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._reap(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def _reap(self, timeout: float | None) -> bool:
        """Whether the command has ended (its exit code in `returncode`), waiting up to `timeout` seconds."""
        if self.returncode is None:
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                return False
            reply = self._conn.recv(MESSAGE_BYTES)
            self._conn.close()
            self.returncode = os.waitstatus_to_exitcode(json.loads(reply)["status"])
        return True

    def communicate(self, input=None, timeout: float | None = None):  # noqa: A002  (Popen's name)
        if input is not None and self.stdin is not None:
            self.stdin.write(input)
        if self.stdin is not None and not self.stdin.closed:
            self.stdin.close()
        if not self._readers:
            for name in ("stdout", "stderr"):
                pipe = getattr(self, name)
                if pipe is not None:
                    self._output[name] = []
                    reader = threading.Thread(target=lambda p=pipe, o=self._output[name]: o.append(p.read()))
                    reader.daemon = True
                    reader.start()
                    self._readers.append(reader)
        deadline = None if timeout is None else _now() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - _now()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - _now()))
        empty = "" if self._text else b""
        joined = {name: empty.join(parts) for name, parts in self._output.items()}
        return joined.get("stdout"), joined.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


def _now() -> float:
    import time

    return time.monotonic()


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # as the commands see it (the checkout, also on PYTHONPATH): not tests/
    preload()
    forked = serve(sys.argv[1])
    if forked is not None:
        run(forked)
