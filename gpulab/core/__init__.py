"""Shared services every lesson uses: the device and its facts (`device`, `specs`), the one timing
function (`timing`), memory readings (`memory`), the NVML monitor (`monitor`), the results store
(`results`), notebook 00's ceilings read back (`ceilings`), the bands (`bands`), a headline's
result (`measured`), the plotting style (`plots`), fresh processes at once (`children`) and a module started
in N processes by torchrun (`launcher`).

Nothing in `gpulab.core` imports from the rest of gpulab (a test holds this).
"""
