# sourced: pip install, env, header into $W/$1-log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD MPLBACKEND=Agg
export W=$OUT/work; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current,compute_mode --format=csv
  date -u; python3 -c "import torch; print(torch.__version__)"; cat .runs/commit.txt; nproc; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; } > $W/$1-header.txt 2>&1
