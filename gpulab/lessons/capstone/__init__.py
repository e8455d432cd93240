"""Lesson 13's parts, each readable alone. The lesson's face, what notebook 13 imports, is
`gpulab.lessons.l13_capstone`.

- `checks`: correct before fast: does a run with some toggles train the same model as the fp32 baseline
  (parameters after a few updates against a measured noise floor, gradients against the baseline's own
  16-bit rounding, how far each tensor moved, the losses).
"""
