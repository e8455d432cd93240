"""The graded exercises' board, live in JupyterLab: what `gpulab room ROOM --board --watch 10` prints in a
terminal, as a table in the instructor's notebook that reads the room folder again every `every_s` seconds.

    from gpulab.tools.board import room_board
    board = room_board("room/")        # shows the table, an "updated HH:MM:SS" line and a Stop button
    board.stop()                       # as the button does; board.refresh() reads the folder now

The rows and their words are `gpulab.tools.room`'s (`exercise_board`, `format_board`): one row per learner and
exercise, their newest own verdict, suspicious rows marked. A results file that cannot be read (half-written, not
a store) is named below the table and read again at the next look; a folder that does not exist (yet) says so and
is looked for again at every refresh. The refresh runs in a background thread: the kernel stays free for other
cells, and an error while reading is shown in the board, never raised into the kernel.
"""
from __future__ import annotations

import html
import math
import threading
import time
from pathlib import Path

import ipywidgets as W
from IPython.display import display

from gpulab.tools.room import BoardRow, exercise_board, format_board, learners

HEADER = ("learner", "exercise", "state", "ratio", "target", "verdict", "when")   # format_board's columns
SUSPICIOUS_STYLE = "background:#ffd6d6;font-weight:bold"
CELL_STYLE = "padding:2px 10px;text-align:left;border-bottom:1px solid #ddd"


def _cells(row: BoardRow) -> list[str]:
    """format_board's own cells for one row (its markdown line), so the words are the terminal board's."""
    line = format_board([row], markdown=True).splitlines()[2]
    known = f"| {row.learner} | {row.exercise} | {row.state} | "
    if line.startswith(known):      # the rest (ratio, target, verdict, when) holds no " | "
        return [row.learner, row.exercise, row.state, *line[len(known):].removesuffix(" |").split(" | ")]
    return [c.strip() for c in line.strip("| ").split(" | ")]


def board_html(folder: str | Path) -> str:
    """The board of the room `folder` as an HTML table (suspicious rows marked), with format_board's summary
    line and the files that could not be read; a clear sentence instead where `folder` is not a folder."""
    root = Path(folder)
    if not root.is_dir():
        what = "a file, not a folder" if root.exists() else "no such folder"
        return (f"<p><b>No room folder at {html.escape(str(root))}</b> ({what}). Name the folder the learners' "
                "results arrive in (the hub's <code>GPULAB_ROOM</code>, default <code>room/</code>); "
                "it is looked for again at every refresh.</p>")
    rows = exercise_board(root)
    unread = [r for r in learners(root) if r.problem]
    out = []
    if rows:
        head = "".join(f'<th style="{CELL_STYLE}">{h}</th>' for h in HEADER)
        body = []
        for r in rows:
            mark = f' class="gpulab-suspicious" style="{SUSPICIOUS_STYLE}"' if r.state == "suspicious" else ""
            body.append(f"<tr{mark}>" + "".join(f'<td style="{CELL_STYLE}">{html.escape(c)}</td>' for c in _cells(r)) + "</tr>")
        out.append(f'<table class="gpulab-board" style="border-collapse:collapse"><tr>{head}</tr>{"".join(body)}</table>')
        out.append(f"<p>{html.escape(format_board(rows).splitlines()[-1])}</p>")
    else:
        n = len(list(root.glob("*.json")))
        out.append(f"<p>No graded exercise submitted yet in {html.escape(str(root))} ({n} results file(s)).</p>")
    if unread:
        out.append("<p>Not read this time (read again at the next look):</p><ul>"
                   + "".join(f"<li>{html.escape(r.name)}: {html.escape(r.problem)}</li>" for r in unread) + "</ul>")
    return "".join(out)


class LiveBoard:
    """The board's widget (`widget`: the table, an "updated" line, a Stop button) and its refresh thread."""

    def __init__(self, folder: str | Path, every_s: float = 10.0):
        if not isinstance(every_s, (int, float)) or not math.isfinite(every_s) or every_s <= 0:
            raise ValueError(f"every_s must be a positive number of seconds, got {every_s!r}")
        self.folder, self.every_s = Path(folder), float(every_s)
        self.table = W.HTML()
        self.status = W.HTML()
        self.stop_button = W.Button(description="Stop", icon="stop", tooltip="stop refreshing the board")
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = W.VBox([W.HTML(f"<b>Exercises' board: {html.escape(str(self.folder))}</b>"),
                              self.table, W.HBox([self.status, self.stop_button])])
        self.refreshes = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def refresh(self) -> None:
        """Read the folder now and redraw; an error while reading is shown, never raised."""
        with self._lock:
            try:
                self.table.value = board_html(self.folder)
                problem = ""
            except Exception as err:             # e.g. the folder's disk went away: say so, try again later
                problem = f" (the last look failed: {type(err).__name__}: {err})"
            self.refreshes += 1
            again = "stopped" if self._stopped.is_set() else f"every {self.every_s:g} s"
            self.status.value = html.escape(f"updated {time.strftime('%H:%M:%S')} ({again}){problem}")

    def start(self) -> "LiveBoard":
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="gpulab-board", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stopped.wait(self.every_s):
            self.refresh()

    def stop(self) -> None:
        """Stop refreshing (the Stop button); the board keeps its last table."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.every_s + 5)
        self.stop_button.disabled = True
        self.refresh()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ipython_display_(self) -> None:
        if not self._shown:          # `room_board(...)` as a cell's last line: shown once, not twice
            self._shown = True
            display(self.widget)


def room_board(folder: str | Path, every_s: float = 10.0) -> LiveBoard:
    """Show the graded exercises' board of the room `folder`, read again every `every_s` seconds until Stop."""
    board = LiveBoard(folder, every_s).start()
    display(board)
    return board
