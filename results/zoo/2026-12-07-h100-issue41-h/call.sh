set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $OUT/shape-env.txt; python3 -c 'import torch; print(torch.__version__)' >> $OUT/shape-env.txt
if [[ "$GPU" == *H200* ]]; then bash scripts/device/course.sh 300 00_gpu_ceilings.ipynb 15_your_training_step.ipynb | tail -5; fi
echo "=== shapes $(date -u +%T)" > $OUT/shape-log.txt
timeout 110 python3 scripts/device/shape_steps.py bert_variable_lengths_compile compile_recompiles collate 300 $OUT/bert-fix.json >> $OUT/shape-log.txt 2>&1
timeout 90 python3 scripts/device/shape_steps.py fairseq_token_batches varying_shapes padded 300 $OUT/fairseq-fix.json >> $OUT/shape-log.txt 2>&1
timeout 30 python3 scripts/device/shape_steps.py fairseq_token_batches none token_batch 150 $OUT/fairseq-none.json >> $OUT/shape-log.txt 2>&1
echo "=== shapes end $(date -u +%T)" >> $OUT/shape-log.txt
grep -v -i warn $OUT/shape-log.txt | tail -6
if [[ "$GPU" != *H200* ]]; then bash scripts/device/zoo.sh $((570 - SECONDS)) diagnose-only:hf_trainer_dynamic_padding label-only:hf_trainer_dynamic_padding; fi
