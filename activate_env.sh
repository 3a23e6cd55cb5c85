# Source me: `source activate_env.sh`. Puts the project's Python environment on PATH.
#
# - If .venv exists, activate it, and reinstall the pinned requirements when requirements.txt changed.
# - Else, if the current Python already imports everything (e.g. a GPU image with jax preinstalled and no internet),
#   use it as it is and install nothing.
# - Else create .venv with the pinned versions from requirements.txt (PyPI only).
# Set PYTHON to choose the interpreter that creates .venv (default: python3, 3.11 or newer).

_gpt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_gpt_imports='import jax, equinox, optax, orbax.checkpoint, chex, hydra, datasets, tokenizers, tiktoken, wandb, tensorboardX, tqdm, dotenv, music21, mido, matplotlib, safetensors, torch, transformers, pytest, xdist, pytest_timeout'
_gpt_stamp="$_gpt_root/.venv/.requirements.sha256"
_gpt_want="$(sha256sum "$_gpt_root/requirements.txt" | cut -d' ' -f1)"

_gpt_install() {
    echo "activate_env: installing pinned requirements into $_gpt_root/.venv (first run only) ..." >&2
    python -m pip install --quiet --disable-pip-version-check -r "$_gpt_root/requirements.txt" 2>&1 \
        | grep -v "^WARNING: Location" >&2
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] && echo "$_gpt_want" > "$_gpt_stamp"
    return "$rc"
}

if [ -x "$_gpt_root/.venv/bin/python" ]; then
    source "$_gpt_root/.venv/bin/activate"
    if [ "$(cat "$_gpt_stamp" 2>/dev/null)" != "$_gpt_want" ]; then
        _gpt_install || return 1 2>/dev/null || exit 1
    fi
elif "${PYTHON:-python3}" -c "$_gpt_imports" 2>/dev/null; then
    echo "activate_env: using $(command -v "${PYTHON:-python3}") (its packages already import; nothing installed)" >&2
else
    "${PYTHON:-python3}" -m venv "$_gpt_root/.venv" || return 1 2>/dev/null || exit 1
    source "$_gpt_root/.venv/bin/activate"
    _gpt_install || return 1 2>/dev/null || exit 1
fi
export PYTHONPATH="$_gpt_root${PYTHONPATH:+:$PYTHONPATH}"
unset _gpt_imports _gpt_stamp _gpt_want
