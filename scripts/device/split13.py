"""Split notebook 13 in two for the device's 600 s call limit: a = up to its graded exercise, b = its first
code cell (imports, device, lesson.start) then the graded exercise and the speedrun."""
import json
nb = json.load(open("notebooks/13_capstone.ipynb"))
cells = nb["cells"]
k = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Graded exercise"))
first = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
for name, part in (("a", cells[:k]), ("b", cells[:first + 1] + cells[k:])):
    json.dump(dict(nb, cells=part), open(f"notebooks/13_capstone_{name}.ipynb", "w"), indent=1)
    print(name, len(part), "cells,", sum(c["cell_type"] == "code" for c in part), "code")
