"""The project's own files agree with each other: dependencies, README commands, CI."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement.strip(), maxsplit=1)[0].lower()


def pyproject_packages() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {_name(r) for r in reqs}


def environment_packages() -> set[str]:
    names, in_deps = set(), False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.startswith("dependencies:"):
            in_deps = True
            continue
        if in_deps and re.match(r"^  - [A-Za-z]", line):   # top-level conda entries only
            name = _name(line[4:])
            if name not in ("python", "pip", "pip:", "nodejs"):    # nodejs: npm for the hub's proxy, not PyPI
                names.add(CONDA_TO_PIP.get(name, name))
    return names


def test_environment_yml_and_pyproject_list_the_same_packages():
    assert environment_packages() == pyproject_packages()
    assert {"torch", "jupyterlab", "ipywidgets", "nvidia-ml-py", "matplotlib", "nbval"} <= pyproject_packages()


def test_the_deprecated_pynvml_distribution_is_not_a_dependency():
    assert "pynvml" not in pyproject_packages() | environment_packages()


def test_environment_yml_installs_the_package_itself():
    assert "- -e ." in (ROOT / "environment.yml").read_text()


def test_console_script_points_at_the_cli():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["gpulab"] == "gpulab.tools.cli:main"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash setup.sh test" in readme and "bash setup.sh lab" in readme
    assert "bash setup.sh test" in ci


def test_setup_script_never_asks_for_an_unpinned_torch_without_a_gpu():
    script = (ROOT / "setup.sh").read_text()
    cpu_branch = script.split("no NVIDIA GPU", 1)[1].split("fi", 1)[0]
    assert "torch==2.13.0" in cpu_branch


def test_every_setup_command_the_readme_names_is_one_setup_sh_accepts():
    readme = (ROOT / "README.md").read_text()
    script = (ROOT / "setup.sh").read_text()
    accepted = set(re.search(r'case "\$mode" in\s*\n\s*([\w|]+)\)', script).group(1).split("|"))
    named = set(re.findall(r"bash setup\.sh (\w+)", readme))
    assert {"lab", "test", "reset"} <= named, "the README's set-up names lab, test and reset"
    assert named <= accepted, f"README names setup.sh modes it does not have: {named - accepted}"


def test_the_learners_working_copy_is_git_ignored_where_setup_sh_makes_it():
    script = (ROOT / "setup.sh").read_text()
    default = re.search(r"work=\$\{GPULAB_NOTEBOOKS:-([\w.-]+)\}", script).group(1)
    assert f"/{default}/" in (ROOT / ".gitignore").read_text().splitlines()
    assert f"{default}/" in (ROOT / "README.md").read_text()


def test_the_readme_links_its_pages_and_every_relative_link_of_the_pages_resolves():
    """The README starts quickly and links the rest (docs/): each docs page is linked from it, and every relative
    link in the README and the pages names a file or folder that exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "no docs/ pages"
    unlinked = [p.name for p in pages if f"](docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    broken = []
    for page in [ROOT / "README.md", *pages, ROOT / "results" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue                                     # a web address, or a heading on the same page
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)
