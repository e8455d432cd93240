"""Lesson 13's parts, each readable alone. The lesson's face, what notebook 13 imports, is
`gpulab.lessons.l13_capstone`: its knobs, `plan`, `training_step` and `headline`, and the names the notebook
uses from here.

- `knobs`: the jobs' sizes and timing budgets at each scale (`CONFIG`, `config`), the constants every run shares;
- `jobs`: the two jobs (a ResNet-50-shaped CNN, a GPT), their sizes, and their FLOP and memory counts;
- `options`: the toggles (`Options`), the combinations refused and why, the default waterfalls, `all_on`;
- `runner`: one run (`run_job`, `JobResult`): build, train its first updates, sample, check, time;
- `checks`: correct before fast: the comparisons of a run with its fp32 reference (losses, movement, the
  systems tier against a noise floor, the numerics tier against the format's rounding);
- `runs`: every run of the notebook, memoized, and checked (`Runs.checked`, `Checked`);
- `waterfall`: toggles added one at a time and their shares, the batch ladder, the tables and plots;
- `peaks`: MFU (against the datasheet) and the fraction of measured peak (against notebook 00's);
- `fp8`: FP8 products against bf16 by size, and the FP8 step's gradient check;
- `time_to_loss`: speed tied to quality, the time to the fp32 baseline's validation loss;
- `seeds`: the seed articles' tables redone on this GPU.
"""
