# Source me: `source activate_env.sh` (training), or `source activate_env.sh test` (training + the test extras).
# Puts the project's Python environment on PATH, with this checkout installed in it (editable: `pip install -e .`,
# without dependencies, the pins below being installed first), so that `import models, training, ...` and the
# scripts work from any directory.
#
# What each set installs (pinned):
#   training  requirements.txt: JAX, Equinox, optax, Orbax, Hydra, datasets, tokenizers, wandb, TensorBoard, ...
#   test      requirements-test.txt: the above + torch (its CPU wheel where pip's index has one: see
#             docs/installation.md) and transformers (HF interop tests), the Hydra launcher/sweeper plugins, lm-eval,
#             pytest and its plugins
#
# - If .venv exists, activate it, and install the set when its requirement files (or pyproject.toml) changed since
#   it was installed; make it anew when it was made elsewhere (a moved or copied checkout) or its Python is gone.
# - Else, if the current Python already has every package the set needs (e.g. a GPU image with jax preinstalled and
#   no internet), use it as it is, first on PATH: nothing installed but this checkout, and only if that Python has no
#   gpt-jax yet (one installed from another checkout is named, not replaced).
#   Found, not imported: importing them all took 6-10 s on 2 cores.
# - Else create .venv and install the set (PyPI only).
# Set PYTHON to choose the interpreter that creates .venv (default: python3, 3.11 or newer).
# On a machine where `nvidia-smi -L` lists a GPU, the set also installs requirements-gpu.txt (JAX's CUDA 12 build at
# the same pin); GPT_JAX_CUDA=1 asks for it anyway, GPT_JAX_CUDA=0 never. `python check_env.py` names the backend.

_gpt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_gpt_modules='jax equinox optax orbax.checkpoint chex hydra datasets tokenizers tiktoken wandb tensorboardX tqdm dotenv music21 mido matplotlib safetensors'
_gpt_files="requirements.txt"
if [ "${1:-}" = "test" ]; then
    _gpt_set=test
    # each requirements-*.txt names the modules its pins provide in an `# imports:` line
    _gpt_modules="$_gpt_modules $(cat "$_gpt_root"/requirements-*.txt | sed -n 's/^# imports: //p' | tr ',' ' ')"
    _gpt_files="requirements.txt $(cd "$_gpt_root" && ls requirements-*.txt | tr '\n' ' ')"
else
    _gpt_set=training
fi
_gpt_cuda="${GPT_JAX_CUDA:-}"
if [ -z "$_gpt_cuda" ]; then
    _gpt_cuda=0
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU " && _gpt_cuda=1
fi
_gpt_stamp="$_gpt_root/.venv/.requirements-$_gpt_set.sha256"
_gpt_want_of() {  # a set's stamp: its requirement files, pyproject.toml, the CUDA choice and the install's mode
    (cd "$_gpt_root" && { cat "$@" pyproject.toml; echo "cuda=$_gpt_cuda editable=compat"; } | sha256sum | cut -d' ' -f1)
}
_gpt_want="$(_gpt_want_of $_gpt_files)"
# The editable install puts the checkout itself on sys.path (a .pth line, setuptools' `compat` mode): its default mode
# finds the packages through an import hook that Python asks only after the path, where a folder named data/, models/
# or core/ in the working directory (dataset.files=[data/*.jsonl]) is taken for the package (`cannot import name`).
_gpt_editable=(--no-deps --no-build-isolation --config-settings editable_mode=compat -e "$_gpt_root")
# Python 3.11 or newer (tomllib, the pins' wheels); a .venv of an older one is made anew
_gpt_new_enough='import sys; sys.exit(sys.version_info < (3, 11))'

_gpt_install_project() {  # this checkout, editable, without dependencies; offline (no build isolation)
    python -m pip install --quiet --disable-pip-version-check "${_gpt_editable[@]}" 2>&1 \
        | grep -v "^WARNING: Location" >&2
    return "${PIPESTATUS[0]}"
}

_gpt_install() {
    local file=requirements.txt
    [ "$_gpt_set" = test ] && file=requirements-test.txt
    local files=(-r "$_gpt_root/$file")
    [ "$_gpt_cuda" = 1 ] && files+=(-r "$_gpt_root/requirements-gpu.txt") && file="$file + requirements-gpu.txt"
    echo "activate_env: installing the pinned $_gpt_set requirements ($file) into $_gpt_root/.venv ..." >&2
    python -m pip install --quiet --disable-pip-version-check "${files[@]}" 2>&1 \
        | grep -v "^WARNING: Location" >&2
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || return "$rc"
    _gpt_install_project || return 1
    echo "$_gpt_want" > "$_gpt_stamp"
    # the test set holds training's pins (requirements-test.txt reads requirements.txt): a later `source
    # activate_env.sh` (train_lm.sh, launch_multihost.sh) in this .venv has nothing to install
    [ "$_gpt_set" = test ] && _gpt_want_of requirements.txt > "$_gpt_root/.venv/.requirements-training.sha256"
    return 0
}

_gpt_new_venv() {  # a .venv made (anew over a stale one), activated, the set installed
    if ! "${PYTHON:-python3}" -c "$_gpt_new_enough" 2>/dev/null; then
        local found
        found="$("${PYTHON:-python3}" -c 'import platform; print(platform.python_version())' 2>/dev/null)"
        found="${found:+is Python $found}"
        echo "activate_env: ${PYTHON:-python3} ${found:-does not run as Python}; the project needs 3.11 or newer:" \
            "set PYTHON to one (e.g. PYTHON=python3.11 source activate_env.sh)" >&2
        return 2
    fi
    "${PYTHON:-python3}" -m venv --clear "$_gpt_root/.venv" || return 1
    source "$_gpt_root/.venv/bin/activate"
    _gpt_install
}

_gpt_here() {  # whether $1 is this checkout's .venv (physical paths: a link to the checkout is the same folder)
    [ "$(cd "$1" 2>/dev/null && pwd -P)" = "$(cd "$_gpt_root/.venv" && pwd -P)" ]
}

if [ -e "$_gpt_root/.venv" ]; then
    # A .venv names its folder in `activate` and in its scripts: one moved or copied with its checkout activates the
    # old place (or nothing), and one whose Python was removed or upgraded has no interpreter: both are made anew, as
    # is one of a Python older than 3.11 (made before PYTHON named a newer one).
    if "$_gpt_root/.venv/bin/python" -c "$_gpt_new_enough" 2>/dev/null && source "$_gpt_root/.venv/bin/activate" \
            && _gpt_here "$VIRTUAL_ENV"; then
        if [ "$(cat "$_gpt_stamp" 2>/dev/null)" != "$_gpt_want" ]; then
            _gpt_install || return 1 2>/dev/null || exit 1
        fi
    else
        echo "activate_env: $_gpt_root/.venv was made elsewhere (a moved or copied checkout), or its Python is" \
            "gone or older than 3.11; making it anew" >&2
        declare -F deactivate >/dev/null && deactivate  # the old place's, a shell function (not a command of that name)
        _gpt_new_venv || {
            [ $? -eq 2 ] || echo "activate_env: could not make $_gpt_root/.venv anew (is PyPI reachable?)" >&2
            return 1 2>/dev/null || exit 1
        }
    fi
elif "${PYTHON:-python3}" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' \
        $_gpt_modules 2>/dev/null; then
    _gpt_python="$(command -v "${PYTHON:-python3}")"
    _gpt_python="$(cd "$(dirname "$_gpt_python")" && pwd)/$(basename "$_gpt_python")"  # absolute
    # the scripts run `python`: this one, first on PATH (through a link of that name, one folder per interpreter,
    # where its folder's `python` is another interpreter, or none)
    _gpt_bin="$(dirname "$_gpt_python")"
    if ! [ "$_gpt_bin/python" -ef "$_gpt_python" ]; then
        _gpt_bin="$_gpt_root/.python-bin/$(printf %s "$_gpt_python" | sha256sum | cut -c1-12)"
        mkdir -p "$_gpt_bin" && ln -sfn "$_gpt_python" "$_gpt_bin/python"
    fi
    case ":$PATH:" in
        ":$_gpt_bin:"*) ;;
        *) export PATH="$_gpt_bin:$PATH" ;;
    esac
    # where its gpt-jax was installed from; a copy (`pip install .`, not -e) is not this checkout, wherever it came from
    _gpt_from="$("$_gpt_python" -c 'import importlib.metadata as m, json, urllib.parse as p
try:
    url = json.loads(m.distribution("gpt-jax").read_text("direct_url.json") or "{}")
    path = p.unquote(p.urlparse(url.get("url", "")).path) or "?"
    print(path if url.get("dir_info", {}).get("editable") else f"{path} as a copy (pip install without -e)")
except m.PackageNotFoundError:
    pass' 2>/dev/null)"
    if [ -n "$_gpt_from" ]; then
        echo "activate_env: using $_gpt_python (it has every package of the set; nothing installed)" >&2
        [ "$(cd "$_gpt_from" 2>/dev/null && pwd -P)" = "$(cd "$_gpt_root" && pwd -P)" ] \
            || echo "activate_env: its gpt-jax is installed from ${_gpt_from}, not this checkout: outside this" \
                "folder the project imports from there ($_gpt_python -m pip install ${_gpt_editable[*]}" \
                "switches)" >&2
    else
        echo "activate_env: using $_gpt_python (it has every package of the set); installing this checkout into it" >&2
        "$_gpt_python" -m pip install --quiet --disable-pip-version-check "${_gpt_editable[@]}" >&2 || {
            echo "activate_env: pip could not install $_gpt_root into $_gpt_python; make a .venv instead:" \
                "$_gpt_python -m venv $_gpt_root/.venv" >&2
            return 1 2>/dev/null || exit 1
        }
    fi
else
    _gpt_new_venv || return 1 2>/dev/null || exit 1
fi
unset -f _gpt_install _gpt_install_project _gpt_new_venv _gpt_here _gpt_want_of
unset _gpt_modules _gpt_editable _gpt_new_enough _gpt_stamp _gpt_want _gpt_files _gpt_set _gpt_python _gpt_cuda _gpt_from _gpt_bin
