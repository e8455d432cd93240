"""gpulab.tools.board: the live exercises' board in a notebook (on the CPU, no kernel needed)."""
import html
import re
import time

import pytest

from gpulab.exercises.exercise import Verdict, record_verdict
from gpulab.tools.board import LiveBoard, board_html, room_board
from gpulab.tools.room import exercise_board, format_board


def submit(room, monkeypatch, learner, state, ratio, task="01.sync", lesson="01"):
    """A verdict written to `learner`'s results file in `room` as `Exercise.check` writes it."""
    monkeypatch.setenv("GPULAB_RESULTS", str(room / f"{learner}.json"))
    record_verdict(Verdict(task, state, [f"{state} (test)"], ratio=ratio, target=None, speed_judged=False),
                   lesson, "you")


def rows_of(text: str) -> list[str]:
    return re.findall(r"<tr[^>]*>.*?</tr>", text)


def test_the_widget_shows_every_learners_row_and_marks_the_suspicious(tmp_path, monkeypatch):
    submit(tmp_path, monkeypatch, "ana", "passed", 1.43)
    submit(tmp_path, monkeypatch, "ben", "suspicious", None)
    (tmp_path / "cut.json").write_text('{"records": [')               # a file being written
    board = LiveBoard(tmp_path, every_s=60)
    board.refresh()
    text = board.table.value
    rows = rows_of(text)
    assert len(rows) == 3, text                                          # the header and one per learner
    ana, ben = rows[1], rows[2]
    assert "ana" in ana and "01.sync" in ana and "passed" in ana and "1.43x" in ana
    assert "gpulab-suspicious" in ben and "SUSPICIOUS" in ben and "gpulab-suspicious" not in ana
    # the words are format_board's: its summary line and each row's verdict
    terminal = format_board(exercise_board(tmp_path))
    assert html.escape(terminal.splitlines()[-1]) in text
    assert "correct (speed not judged here)" in ana and "correct (speed not judged here)" in terminal
    assert "cut: not readable JSON yet" in text                        # named, not skipped silently
    assert re.search(r"updated \d\d:\d\d:\d\d", board.status.value), board.status.value


def test_a_refresh_picks_up_a_new_verdict_file(tmp_path, monkeypatch):
    submit(tmp_path, monkeypatch, "ana", "failed", None)
    board = room_board(tmp_path, every_s=0.05)
    try:
        assert board.running and "ana" in board.table.value and "cara" not in board.table.value
        submit(tmp_path, monkeypatch, "cara", "passed", 1.6)
        submit(tmp_path, monkeypatch, "ana", "passed", 1.5)              # ana's newest verdict replaces her first
        deadline = time.monotonic() + 10
        while "cara" not in board.table.value and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "cara" in board.table.value, "the background refresh did not pick up cara's file"
        deadline = time.monotonic() + 10
        while "1.50x" not in board.table.value and time.monotonic() < deadline:
            time.sleep(0.05)
        ana = [r for r in rows_of(board.table.value) if "ana" in r]
        assert len(ana) == 1 and "1.50x" in ana[0] and "passed" in ana[0], ana
        assert board.refreshes >= 2
    finally:
        board.stop()
    assert not board.running and board.stop_button.disabled and "stopped" in board.status.value
    seen = board.refreshes
    time.sleep(0.3)
    assert board.refreshes == seen, "the board kept refreshing after Stop"


def test_the_stop_button_stops_the_thread(tmp_path):
    board = room_board(tmp_path, every_s=0.05)
    assert board.running
    board.stop_button.click()                                           # as the instructor's click does
    assert not board.running and "stopped" in board.status.value


@pytest.mark.parametrize("make", ["missing", "file"])
def test_a_bad_folder_says_so_and_the_board_keeps_looking(tmp_path, make):
    where = tmp_path / "room"
    if make == "file":
        where.write_text("not a folder")
    board = room_board(where, every_s=0.05)
    try:
        text = board.table.value
        assert f"No room folder at {where}" in text
        assert ("a file, not a folder" if make == "file" else "no such folder") in text
        assert "<table" not in text
        if make == "missing":                                            # the hub makes it later
            where.mkdir()
            deadline = time.monotonic() + 10
            while "No room folder" in board.table.value and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "No graded exercise submitted yet" in board.table.value
    finally:
        board.stop()


def test_board_html_of_an_empty_room_and_a_bad_interval(tmp_path):
    assert "No graded exercise submitted yet" in board_html(tmp_path) and "(0 results file(s))" in board_html(tmp_path)
    for bad in (0, -1, float("nan"), "10"):
        with pytest.raises(ValueError, match="every_s must be a positive number"):
            room_board(tmp_path, every_s=bad)
