"""gpulab.diagnose: which of the course's bottlenecks is yours, and what fixing it would buy.

    import gpulab
    d = gpulab.diagnose(step)   # the package is callable: the same as gpulab.diagnose.diagnose(step)          # step(): one whole training step, batch fetching included
    print(d.report())           # busy/idle split, kernel classes, memory, MFU, ranked verdicts
    d.plot()                    # the profiled steps' timeline

- `events.py`: the neutral event model (`Event`) and the torch.profiler parser (`from_profiler`);
- `facts.py`: the `Facts` contract, what the analysis finds and the rules read (readable alone);
- `kernels.py`: kernel classes (GEMM or not, Tensor Cores or not), the op and call names, GEMM shapes;
- `analyze.py`: facts from events (`analyze` -> `Facts`): busy/idle, the host's time by cause, the patterns;
- `rules.py`: the host-side rules and `TABLE` (one row per rule), the ranking, `run_rules`; `kernel_rules.py`:
  the GPU-side rules; `verdicts.py`: `Verdict` and how a measured fix is judged against its promise;
- `core.py`: `diagnose()` and `Diagnosis` (report, plot, to_dict); `report.py`: its report and timeline;
  `confirm.py`: the variants that measure a verdict's fix, and the ranking on what they measured;
  `model_variants.py`: those made to the step's model (compiled, CUDA graphs, channels_last);
- `zoo.py`, `zoo_label.py`: the zoo of steps from outside the course, labelled by measurement, and the judge.
"""
import sys
import types

from gpulab.diagnose.analyze import analyze
from gpulab.diagnose.facts import CAUSES, CLASSES, Facts, GemmFact, MemoryFacts
from gpulab.diagnose.core import DiagnoseError, Diagnosis, diagnose
from gpulab.diagnose.events import Event, Record, from_profiler, parse
from gpulab.diagnose.rules import GPU_ONLY, RULES, Verdict, run_rules
from gpulab.diagnose.confirm import skippable     # the report and notebook 15 name it gpulab.diagnose.skippable

__all__ = [
    "CAUSES", "CLASSES", "GPU_ONLY", "RULES", "DiagnoseError", "Diagnosis", "Event", "Facts",
    "GemmFact", "MemoryFacts", "Record", "Verdict", "analyze", "diagnose", "from_profiler", "parse",
    "run_rules", "skippable",
]


class _CallableModule(types.ModuleType):
    """`gpulab.diagnose(step)` calls `diagnose`, while `gpulab.diagnose` stays the package its parts
    are imported from (`from gpulab.diagnose import Verdict`)."""

    def __call__(self, step, **kwargs) -> Diagnosis:
        return diagnose(step, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
