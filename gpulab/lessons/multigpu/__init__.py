"""Lesson 14's parts, each readable alone: `arithmetic` (the formulas and the gradient check), `worker` (what
every worker process shares), the experiments `ddp`, `allreduce`, `pipeline` and `fsdp`, and `cli`, the
command each worker process runs. The lesson's face, what notebook 14 imports, is `gpulab.lessons.l14_multi_gpu`;
the launcher that starts the processes is `gpulab.core.launcher`.
"""
