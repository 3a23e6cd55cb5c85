"""The Hugging Face Hub as the environment offers it: whether it can be reached, and going offline when it cannot.

Datasets (data/) and GPT-2 weights (models/hf.py) both come from the Hub; both ask here first, so that an unreachable
Hub costs one name lookup instead of huggingface_hub's retries, and offline mode (HF_HUB_OFFLINE=1) costs none.
"""

from __future__ import annotations

import socket

from core.hf_datasets import hf_datasets


def hub_reachable(host: str = "huggingface.co") -> bool:
    """Whether the Hub's name resolves; no probe at all in offline mode (HF_HUB_OFFLINE=1), which means: never ask."""
    if hf_datasets().config.HF_HUB_OFFLINE:
        return False
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def offline_hub() -> None:
    """Without this, huggingface_hub retries for ~25 s when the Hub is unreachable; offline mode still reads a
    local cache and local folders."""
    import huggingface_hub.constants

    hf_datasets().config.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
