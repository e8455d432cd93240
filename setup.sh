#!/usr/bin/env bash
# gpulab set-up. Two commands, each installs what it needs into ./.venv first:
#
#   bash setup.sh lab     # install, then start JupyterLab on notebooks/ (localhost, with a token)
#   bash setup.sh test    # install, then run every test (unit tests + notebooks under nbval)
#
# PyTorch: where an NVIDIA GPU answers (nvidia-smi), a CUDA build from PyPI;
# elsewhere the CPU build of torch 2.13.0 (a few hundred MB, never the multi-GB
# CUDA build). Set GPULAB_TORCH to a pip requirement to choose another.
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-}
case "$mode" in
  lab|test) shift ;;
  *) echo "usage: bash setup.sh lab | test [extra arguments for jupyter lab / pytest]" >&2; exit 2 ;;
esac

venv=${GPULAB_VENV:-.venv}
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating a virtual environment in $venv"
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)

if ! "$py" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found: installing a CUDA build of PyTorch"
    "${pip[@]}" "${GPULAB_TORCH:-torch>=2.4}"
  else
    echo "setup: no NVIDIA GPU: installing the CPU build of PyTorch (lessons run tiny, numbers illustrative)"
    # PyTorch's CPU wheel index; --retries 0 so a closed network falls back at once.
    "${pip[@]}" --retries 0 --timeout 20 "${GPULAB_TORCH:-torch==2.13.0}" \
      --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi

if [ "$mode" = lab ]; then
  "${pip[@]}" -e .
  args=(--ip=127.0.0.1 --port="${GPULAB_PORT:-8888}" --ServerApp.root_dir="${GPULAB_NOTEBOOKS:-notebooks}")
  [ "$(id -u)" = 0 ] && args+=(--allow-root)
  echo "setup: starting JupyterLab; open the http://127.0.0.1:...?token=... address it prints"
  exec "$venv/bin/jupyter" lab "${args[@]}" "$@"
else
  "${pip[@]}" -e ".[test]"
  exec "$py" -m pytest "$@"
fi
