"""Print the versions, backend and devices this project runs on; exit 1 with one line if something is missing.

    python check_env.py          # training's packages
    python check_env.py --test   # and the test command's extras

Packages are found (importlib's `find_spec`), not imported: importing all of them took 15 s on 2 CPU cores (torch,
optuna and tensorboardX's torch import alone 10 s) before every `scripts/test.sh`, whose tests import each anyway.
Only JAX is imported, for the backend and devices. Where `nvidia-smi -L` lists a GPU but JAX's backend is the CPU
(the CPU build of jaxlib installed), a one-line warning says how to get the CUDA build; where an installed version is
outside pyproject.toml's range for it (a Python used as it is: a GPU image, a cluster's module), one line names them.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent / "pyproject.toml"

REQUIRED = {  # distribution name -> module it provides
    "jax": "jax",
    "jaxlib": "jaxlib",
    "equinox": "equinox",
    "optax": "optax",
    "orbax-checkpoint": "orbax.checkpoint",
    "chex": "chex",
    "hydra-core": "hydra",
    "datasets": "datasets",
    "tokenizers": "tokenizers",
    "tiktoken": "tiktoken",
    "wandb": "wandb",
    "tensorboardX": "tensorboardX",
    "tensorboard": "tensorboard",
    "numpy": "numpy",
    "tqdm": "tqdm",
    "python-dotenv": "dotenv",
    "music21": "music21",
    "mido": "mido",
    "matplotlib": "matplotlib",
    "safetensors": "safetensors",
}
# The test command's extras (requirements-test.txt): listed when installed, required with --test.
TEST_EXTRAS = {
    "torch": "torch",
    "transformers": "transformers",
    "lm-eval": "lm_eval",
    "pytest": "pytest",
    "pytest-xdist": "xdist",
    "pytest-timeout": "pytest_timeout",
    "ruff": "ruff",
    "hydra-joblib-launcher": "hydra_plugins.hydra_joblib_launcher",
    "hydra-submitit-launcher": "hydra_plugins.hydra_submitit_launcher",
    "hydra-optuna-sweeper": "hydra_plugins.hydra_optuna_sweeper",
    "optuna": "optuna",
}


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    if unknown := [a for a in argv if a != "--test"]:
        print(f"error: check_env.py takes --test or nothing; got {' '.join(unknown)}", file=sys.stderr)
        return 2
    # before anything of 3.11's (tomllib): one line, not an ImportError, in a Python older than pyproject allows
    if sys.version_info < (3, 11):  # noqa: UP036
        print(
            f"error: {sys.executable} is Python {platform.python_version()}; the project needs 3.11 or newer",
            file=sys.stderr,
        )
        return 1
    test = "--test" in argv
    missing = []
    print(f"python        {platform.python_version()} ({sys.executable})")
    for dist, module in {**REQUIRED, **TEST_EXTRAS}.items():
        try:
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"No module named '{module}'")
            print(f"{dist:<13} {version(dist)}")
        except (ImportError, PackageNotFoundError) as e:
            if dist in REQUIRED or test:
                missing.append(f"{dist} ({type(e).__name__}: {e})")
            else:
                print(f"{dist:<13} not installed (the test extra: source activate_env.sh test)")
    if missing:
        fix = "source activate_env.sh test" if test else "source activate_env.sh"
        print(f"error: missing packages: {'; '.join(missing)}. Run `{fix}`", file=sys.stderr)
        return 1
    if outside := outside_ranges():
        print(
            f"warning: outside pyproject.toml's ranges: {'; '.join(outside)}. The tested versions are "
            "requirements*.txt's (source activate_env.sh installs them)",
            file=sys.stderr,
        )
    import jax

    try:
        devices = jax.devices()
    except Exception as e:  # a backend asked for that cannot start: what this script is run to find out
        import os

        asked = os.environ.get("JAX_PLATFORMS")
        print(
            f"error: JAX could not start its backend{f' (JAX_PLATFORMS={asked})' if asked else ''}: "
            f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no reason given'}. For a "
            "GPU, JAX's CUDA build: rm -rf .venv && source activate_env.sh (it detects the GPU), or pip install -e "
            "'.[gpu]'",
            file=sys.stderr,
        )
        return 1
    kinds = sorted({d.device_kind for d in devices})
    print(f"backend       {jax.default_backend()}")
    print(
        f"devices       {len(devices)} ({', '.join(kinds)}), {jax.local_device_count()} local, "
        f"process {jax.process_index()} of {jax.process_count()}"
    )
    gpus = nvidia_gpus()
    if gpus and jax.default_backend() == "cpu":
        print(
            f"warning: {len(gpus)} NVIDIA GPU(s) here ({gpus[0]}) but JAX runs on the CPU: install JAX's CUDA build "
            "(rm -rf .venv && source activate_env.sh, which detects the GPU; or pip install -e '.[gpu]')",
            file=sys.stderr,
        )
    return 0


def outside_ranges() -> list[str]:
    """`<package> <version> (wants <range>)` for each installed package of pyproject.toml's dependencies and extras
    whose version its range excludes (a pre-release, development or local build, such as a GPU image's, counts as the
    release it leads to: 0.10.2rc1 and 0.10.2+cuda12 as 0.10.2)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    if PYPROJECT.exists():
        import tomllib  # Python 3.11's: main checks the version first

        project = tomllib.loads(PYPROJECT.read_text())["project"]
        lines = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    else:  # an installed copy (`pip install .`: no pyproject.toml beside it): its metadata holds the same ranges
        try:
            lines = requires("gpt-jax") or []
        except PackageNotFoundError:
            return []
    outside = {}
    for line in lines:
        wanted = Requirement(line)
        try:
            installed = version(wanted.name)
        except PackageNotFoundError:
            continue  # missing: said above where needed
        if wanted.specifier and not wanted.specifier.contains(Version(installed).base_version):
            outside[wanted.name] = f"{wanted.name} {installed} (wants {wanted.specifier})"
    return list(outside.values())


def nvidia_gpus() -> list[str]:
    """The NVIDIA GPUs `nvidia-smi -L` lists (none where it is missing or fails)."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split(" (UUID")[0] for line in listed.splitlines() if line.startswith("GPU ")]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
