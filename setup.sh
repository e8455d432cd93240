#!/usr/bin/env bash
# gpulab set-up. Two commands, each installs what it needs into ./.venv first:
#
#   bash setup.sh lab     # install, then start JupyterLab on your working copy my-notebooks/ (localhost, with a token)
#   bash setup.sh test    # install, then run every test (unit tests + notebooks under nbval)
#
#   bash setup.sh hub     # install JupyterHub and its proxy, then start a workshop hub (docs/instructors.md: "Running a workshop")
#
# and one that installs nothing:
#
#   bash setup.sh reset 03   # start lesson 03 afresh: my-notebooks/03_*.ipynb from notebooks/ (old copy kept)
#
# Your working copy: JupyterLab saves outputs and edits into the notebooks it has
# open, so `lab` opens my-notebooks/ (git-ignored), a copy of notebooks/ made on
# first start; notebooks/ and the clone stay clean. A later start copies lessons
# that notebooks/ has gained (after a git pull) and never overwrites yours.
# GPULAB_NOTEBOOKS names another folder for the working copy (notebooks itself
# means no copy: you edit the tracked lessons).
#
# PyTorch: where an NVIDIA GPU answers (nvidia-smi), a CUDA build from PyPI;
# elsewhere the CPU build of torch 2.13.0 (a few hundred MB, never the multi-GB
# CUDA build). Set GPULAB_TORCH to a pip requirement to choose another.
# GPULAB_SKIP_INSTALL=1 uses the virtual environment as it is (offline, or tests sharing one).
set -euo pipefail
cd "$(dirname "$0")"

usage="usage: bash setup.sh lab | test | hub [extra arguments for jupyter lab / pytest / jupyterhub]
       bash setup.sh reset NN [NN ...] | all   (start lessons afresh in your working copy)"
mode=${1:-}
case "$mode" in
  lab|test|hub|reset) shift ;;
  *) echo "$usage" >&2; exit 2 ;;
esac

lessons=notebooks                           # the clean lessons, tracked by git
work=${GPULAB_NOTEBOOKS:-my-notebooks}      # the learner's copy, where JupyterLab opens
work=${work%/}
origin="$work/.gpulab-origin"               # "name checksum" of the notebooks/ file each copy came from

same_folder() { [ -d "$1" ] && [ "$(cd "$1" && pwd -P)" = "$(cd "$2" && pwd -P)" ]; }
checksum() { cksum < "$1" | cut -d' ' -f1,2 | tr ' ' -; }
remember() {   # remember which notebooks/ version the copy $1 came from
  local name=$1 rest=""
  [ -f "$origin" ] && rest=$(grep -v "^$name " "$origin" || true)
  { [ -n "$rest" ] && printf '%s\n' "$rest"; echo "$name $(checksum "$lessons/$name")"; } > "$origin.tmp"
  mv "$origin.tmp" "$origin"
}

# Copy every lesson the working copy lacks; say what was made, what is new, what changed upstream.
working_copy() {
  if same_folder "$work" "$lessons"; then
    echo "setup: GPULAB_NOTEBOOKS is notebooks/ itself: JupyterLab saves outputs into the tracked lessons (git status will show them)"
    return
  fi
  local first="" new="" changed="" count=0 src name had
  [ -f "$origin" ] || first=1
  mkdir -p "$work"
  for src in "$lessons"/*.ipynb; do
    name=${src##*/}
    if [ ! -e "$work/$name" ]; then
      cp "$src" "$work/$name"
      remember "$name"
      new="$new $name"; count=$((count + 1))
    elif had=$(grep "^$name " "$origin" 2>/dev/null) && [ "${had#* }" != "$(checksum "$src")" ]; then
      changed="$changed ${name%%_*}"
    fi
  done
  if [ -n "$first" ]; then
    echo "setup: made your working copy $work/ from notebooks/ ($count lessons). JupyterLab opens it and saves"
    echo "setup:   your edits and outputs there; git ignores it, notebooks/ stays clean."
  else
    echo "setup: JupyterLab opens your working copy $work/ (git-ignored; the clean lessons are in notebooks/)"
    if [ -n "$new" ]; then echo "setup: new lessons in notebooks/, copied into $work/:$new"; fi
  fi
  if [ -n "$changed" ]; then
    echo "setup: changed in notebooks/ since you copied them (kept as you left them):$changed"
    echo "setup:   take the new version with: bash setup.sh reset$changed   (your copy is kept in $work/replaced/)"
  else
    echo "setup: start a lesson afresh with: bash setup.sh reset NN   (e.g. reset 03; your copy is kept in $work/replaced/)"
  fi
  if command -v git >/dev/null 2>&1 && [ -n "$(ls "$work"/*.ipynb 2>/dev/null | head -1)" ]; then
    local probe rc=0
    probe=$(ls "$work"/*.ipynb | head -1)
    git check-ignore -q "$probe" 2>/dev/null || rc=$?
    if [ "$rc" = 1 ]; then
      echo "setup: warning: git does not ignore $work/: your outputs will show in git status (add it to .gitignore)"
    fi
  fi
  return 0
}

# Replace the working copy of each named lesson with a fresh one from notebooks/.
reset_lessons() {
  [ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
  if same_folder "$work" "$lessons"; then
    echo "setup: GPULAB_NOTEBOOKS is notebooks/ itself, there is no copy to reset (git checkout -- notebooks/NN_*.ipynb does that)" >&2
    exit 2
  fi
  local picked=() arg key matches src name stamp keep n
  for arg in "$@"; do
    if [ "$arg" = all ]; then
      picked+=("$lessons"/*.ipynb); continue
    fi
    key=${arg##*/}; key=${key%.ipynb}
    matches=()
    for src in "$lessons"/"$key"*.ipynb; do [ -e "$src" ] && matches+=("$src"); done
    if [ ${#matches[@]} -ne 1 ]; then
      echo "setup: reset $arg: expected one lesson in notebooks/ to match, found ${#matches[@]}; lessons are:" >&2
      (cd "$lessons" && ls ./*.ipynb | sed 's|^\./|  |') >&2
      exit 2
    fi
    picked+=("${matches[0]}")
  done
  mkdir -p "$work"
  stamp=$(date +%Y%m%d-%H%M%S)
  for src in "${picked[@]}"; do
    name=${src##*/}
    if [ ! -e "$work/$name" ]; then
      cp "$src" "$work/$name"; remember "$name"
      echo "setup: reset ${name%%_*}: $work/$name did not exist; copied it from notebooks/"
    elif cmp -s "$src" "$work/$name"; then
      remember "$name"
      echo "setup: reset ${name%%_*}: $work/$name is already the clean notebooks/$name; nothing replaced"
    else
      mkdir -p "$work/replaced"
      keep="$work/replaced/${name%.ipynb}-$stamp.ipynb"; n=1
      while [ -e "$keep" ]; do keep="$work/replaced/${name%.ipynb}-$stamp-$n.ipynb"; n=$((n + 1)); done
      mv "$work/$name" "$keep"
      cp "$src" "$work/$name"; remember "$name"
      echo "setup: reset ${name%%_*}: replaced $work/$name with a fresh copy of notebooks/$name;"
      echo "setup:   your previous copy is $keep. If the lesson is open in JupyterLab, reload it"
      echo "setup:   (File > Reload Notebook from Disk) rather than saving the old one over it."
    fi
  done
}

if [ "$mode" = reset ]; then
  reset_lessons "$@"
  exit 0
fi

venv=${GPULAB_VENV:-.venv}
python=${PYTHON:-python3}
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)

if [ "${GPULAB_SKIP_INSTALL:-0}" = 1 ]; then
  [ -x "$py" ] || { echo "setup: GPULAB_SKIP_INSTALL=1 but there is no $py" >&2; exit 1; }
  echo "setup: GPULAB_SKIP_INSTALL=1: using $venv as it is"
else
  fresh=0
  if [ ! -x "$py" ]; then
    echo "setup: creating a virtual environment in $venv"
    "$python" -m venv "$venv"
    # pip byte-compiles what it installs one file at a time (about half of a fresh install on 2 cores); a new
    # environment is compiled once at the end on every core instead (compileall -j 0)
    fresh=1
    pip+=(--no-compile)
  fi
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
  elif [ "$mode" = hub ]; then
    "${pip[@]}" -e ".[hub]"
  else
    "${pip[@]}" -e ".[test]"
  fi
  if [ "$fresh" = 1 ]; then
    echo "setup: compiling the new environment's Python files on every core"
    "$py" -m compileall -q -j 0 "$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
      >/dev/null 2>&1 || true      # a package's deliberately broken files (test data) do not compile: as with pip
  fi
  # JupyterHub's proxy (configurable-http-proxy) comes from the npm registry, into .hub/ (git-ignored)
  if [ "$mode" != lab ] && [ ! -x .hub/node_modules/.bin/configurable-http-proxy ]; then
    if command -v npm >/dev/null 2>&1; then
      echo "setup: installing JupyterHub's proxy (configurable-http-proxy) into .hub/ with npm"
      if ! npm install --silent --no-audit --no-fund --prefix .hub configurable-http-proxy >/dev/null; then
        echo "setup: npm could not install configurable-http-proxy (it needs Node.js 20 or newer: node --version)" >&2
        if [ "$mode" = hub ]; then exit 1; fi
        echo "setup: the hub test will skip" >&2
      fi
    else
      echo "setup: no npm: JupyterHub's proxy is not installed (needs Node.js 20 or newer)" >&2
      if [ "$mode" = hub ]; then exit 1; fi
    fi
  fi
fi

if [ "$mode" = hub ]; then
  # the workshop hub (workshop/jupyterhub_config.py; docs/instructors.md, "Running a workshop")
  export PATH="$PWD/.hub/node_modules/.bin:$PWD/$venv/bin:$PATH"
  echo "setup: starting JupyterHub for a workshop room (workshop/jupyterhub_config.py); learners log in on port 8000"
  exec "$venv/bin/jupyterhub" -f workshop/jupyterhub_config.py "$@"
elif [ "$mode" = lab ]; then
  working_copy
  args=(--ip=127.0.0.1 --ServerApp.root_dir="$work")
  # a --port of the caller's wins (jupyter refuses two); else GPULAB_PORT or 8888
  case " $* " in *" --port"*|*" --ServerApp.port"*) ;; *) args+=(--port="${GPULAB_PORT:-8888}") ;; esac
  [ "$(id -u)" = 0 ] && args+=(--allow-root)
  echo "setup: starting JupyterLab on $work/; open the http://127.0.0.1:...?token=... address it prints"
  exec "$venv/bin/jupyter" lab "${args[@]}" "$@"
else
  # Without a GPU the tests run in GPULAB_TEST_WORKERS processes (default 2; 1 runs them in one), each test
  # file whole in one of them (nbval runs a notebook's cells in order in one kernel), each process on one
  # thread (OMP_NUM_THREADS=1: two processes each spinning two threads on two cores ran the suite slower than
  # one). With a GPU they run in one process: the notebooks time the GPU, and two at once would share it.
  workers=${GPULAB_TEST_WORKERS:-}
  if [ -z "$workers" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then workers=1; else workers=2; fi
  fi
  if [ "$workers" != 1 ] && "$py" -c "import xdist" 2>/dev/null; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    echo "setup: running the tests in $workers processes (GPULAB_TEST_WORKERS=1: in one)"
    exec "$py" -m pytest -n "$workers" --dist loadfile "$@"
  fi
  exec "$py" -m pytest "$@"
fi
