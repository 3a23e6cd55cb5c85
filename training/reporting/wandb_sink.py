"""wandb (`logging.wandb`: online, offline or disabled): each number as `<split>/<name>`, the final figures in the
run's summary. A resumed run continues the same wandb run (its id is in the checkpoint's metadata)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from core.errors import ConfigError, MissingPackageError, PipelineError, first_line, warn
from core.secrets import secret

if TYPE_CHECKING:
    from training.config import Config

WANDB_CONNECT_TIMEOUT_S = 5  # online: how long the server has to take a connection before wandb.init is tried
WANDB_INIT_TIMEOUT_S = 30  # and wandb.init to start the run (its default is 90 s, retried)


class Wandb:
    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None) -> None:
        self.run = _start_wandb(cfg, run_dir, run_id)

    @property
    def id(self) -> str:
        return self.run.id

    def log(self, step: int, split: str, numbers: dict[str, float]) -> None:
        self.run.log({f"{split}/{k}": v for k, v in numbers.items()}, step=step)

    def close(self, hparams: dict[str, Any] | None, final: dict[str, float] | None) -> None:
        if final:
            self.run.summary.update(final)
        self.run.finish()


def _start_wandb(cfg: Config, run_dir: Path, run_id: str | None):
    """wandb in the configured mode. Online, a server that cannot be reached or refuses the key is known within
    WANDB_CONNECT_TIMEOUT_S + WANDB_INIT_TIMEOUT_S (wandb alone would retry for minutes and end in its own multi-line
    error): then one line, or (logging.wandb_fallback=offline) a warning and an offline run. A wandb that cannot
    be imported (it, or a package of its own, missing) is one line too: the environment's fault, not the run's."""
    try:
        import wandb
    except ImportError as e:
        raise MissingPackageError(
            f"logging.wandb={cfg.logging.wandb}: wandb cannot be imported ({first_line(e)}); install the pinned "
            "packages (source activate_env.sh), or use logging.wandb=disabled"
        ) from None

    mode = cfg.logging.wandb
    api_key = secret("WANDB_API_KEY")
    if mode == "online" and not api_key:
        raise ConfigError(
            "config: logging.wandb=online needs WANDB_API_KEY in the environment or in .env; "
            "or use logging.wandb=offline (sync later with `wandb sync`)"
        )
    # Its notices (e.g. which credentials it uses) are not ours to print; its settings name the server (WANDB_BASE_URL).
    session = wandb.setup(settings=wandb.Settings(silent=True))
    if mode == "online":
        base_url = session.settings.base_url
        problem = _unreachable(base_url)
        if problem is None:
            try:
                return _init_wandb(cfg, run_dir, run_id, "online", api_key)
            except wandb.errors.Error as e:
                problem = f"the wandb server at {base_url} refused: {first_line(e)}"
        if cfg.logging.wandb_fallback != "offline":
            raise PipelineError(
                f"logging.wandb=online: {problem}; check WANDB_API_KEY and the network, or use "
                "logging.wandb=offline, or logging.wandb_fallback=offline to log offline and `wandb "
                "sync` later"
            )
        warn(
            f"logging.wandb=online: {problem}; logging offline instead (logging.wandb_fallback=offline): upload "
            f"later with `wandb sync {run_dir / 'wandb'}/offline-run-*`"
        )
    return _init_wandb(cfg, run_dir, run_id, "offline" if mode == "online" else mode, None)


def _init_wandb(cfg: Config, run_dir: Path, run_id: str | None, mode: str, api_key: str | None):
    import wandb

    from training.config import as_dict

    settings = wandb.Settings(
        api_key=api_key,
        silent=True,
        console="off",
        disable_git=True,
        x_save_requirements=False,
        init_timeout=WANDB_INIT_TIMEOUT_S,
    )
    return wandb.init(
        project=cfg.logging.wandb_project,
        entity=cfg.logging.wandb_entity,
        name=run_dir.name,
        id=run_id,
        resume="allow" if run_id else None,
        dir=str(run_dir),
        mode=mode,
        config=as_dict(cfg),
        settings=settings,
    )


def _unreachable(url: str) -> str | None:
    """Why the server at `url` takes no connection (no network, wrong address, refused), or None when it does."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=WANDB_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return f"cannot reach the wandb server at {url} ({e.strerror or type(e).__name__})"
    return None
