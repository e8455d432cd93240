"""The instructor's page (docs/instructors.md, "Running a workshop") matches the files in the repository: every file it
names exists, every file in workshop/ is named, and every setting it tells the instructor to export is
one the hub configuration reads."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _page() -> str:
    text = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    start = text.index("## Running a workshop")
    return text[start:text.index("\n## ", start + 1)]


def test_every_file_the_page_names_exists_and_every_workshop_file_is_named():
    page = _page()
    named = set(re.findall(r"`((?:workshop|tests/workshop)/[\w./-]+)`", page))
    assert named, "the page names no files"
    missing = [p for p in named if not (ROOT / p).exists()]
    assert not missing, f"the page names files that do not exist: {missing}"
    unnamed = [p.name for p in (ROOT / "workshop").iterdir() if f"workshop/{p.name}" not in named]
    assert not unnamed, f"workshop/ files the page does not describe: {unnamed}"


def test_every_setting_on_the_page_is_read_by_the_hub_configuration():
    config = (ROOT / "workshop" / "jupyterhub_config.py").read_text(encoding="utf-8")
    settings = set(re.findall(r"\b(GPULAB_HUB_\w+|GPULAB_ROOM)\b", _page())) - {"GPULAB_HUB_"}
    assert {"GPULAB_HUB_DEVICES", "GPULAB_HUB_PASSWORD"} <= settings
    unread = [s for s in settings if s not in config]
    assert not unread, f"the page tells instructors to set {unread}, which workshop/jupyterhub_config.py never reads"
    assert "bash setup.sh hub" in _page() and "lab|test|hub|reset)" in (ROOT / "setup.sh").read_text()
