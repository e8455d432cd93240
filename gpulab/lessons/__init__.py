"""One module per notebook, named like it (`l03_input_pipeline` for `03_input_pipeline.ipynb`).

A benched lesson's module starts with its knobs (`TITLE`, `HEADLINE`: the metric bands.toml judges,
`CONFIG`: its sizes at each scale, read with `config(scale)`), then its experiment functions, then
`headline(scale)`: the lesson's headline measurement, which its notebook's self-check calls and
`gpulab bench` runs.
"""
