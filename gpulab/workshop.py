"""JupyterHub spawners for a workshop room on one GPU server (`workshop/jupyterhub_config.py` uses them).

Each learner's server is started with:

- a GPU of its own, or a MIG slice, or a share of a time-sliced GPU: `CUDA_VISIBLE_DEVICES` set to the
  next entry of `devices` (GPU indices like "0", or MIG UUIDs like "MIG-0b5c...", as `nvidia-smi -L`
  lists them), learners assigned in the order they first start, round robin. More learners than
  entries share: their records are marked shared by the course itself (`monitor.sharing_mark` sees the
  other processes on the GPU).
- the course's working copy made for them: the lessons of `notebooks/` copied into their own folder on
  first start (never overwritten later), as `bash setup.sh lab` does for one learner.
- their results store in the room folder: `GPULAB_RESULTS=<room>/<learner>.json`, which the instructor
  watches with `gpulab room <room> --learners --watch`.
- a GPU profile if the room asks for one (`profile`, e.g. a MIG slice emulated on a whole GPU).

`RoomSpawner` starts each server as the learner's own system user (JupyterHub's LocalProcessSpawner:
learners are accounts on the server). `SimpleRoomSpawner` starts them all as the hub's user, each in its
own folder: a single-account server, and the CPU load test in tests/workshop.

Importing this module needs JupyterHub (`bash setup.sh hub` installs it); gpulab itself does not.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from traitlets import Dict, HasTraits, List, Unicode

REPO = Path(__file__).resolve().parent.parent


def working_copy(lessons: Path, folder: Path) -> list[str]:
    """Copy every lesson of `lessons` that `folder` lacks into it (the learner's edits are never
    overwritten); returns the names copied."""
    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    for src in sorted(lessons.glob("*.ipynb")):
        dst = folder / src.name
        if not dst.exists():
            shutil.copyfile(src, dst)
            copied.append(src.name)
    return copied


class RoomMixin(HasTraits):
    """What a workshop room adds to a spawner: a device per learner, a working copy, a room folder."""

    devices = List(Unicode(), help="CUDA_VISIBLE_DEVICES values handed out in turn: GPU indices or MIG UUIDs; "
                                   "empty: every learner sees every GPU").tag(config=True)
    room = Unicode("room", help="the folder learners' results stores are written to (one JSON file each)").tag(config=True)
    lessons = Unicode(str(REPO / "notebooks"), help="the clean lessons copied into each learner's folder").tag(config=True)
    profile = Unicode("", help="GPULAB_PROFILE for every learner (e.g. a MIG slice emulated on a whole GPU)").tag(config=True)
    room_env = Dict(help="more environment for every learner's server").tag(config=True)

    _assigned: dict = {}        # learner -> device, shared by every spawner of the hub process

    def device_for(self, name: str) -> str | None:
        if not self.devices:
            return None
        if name not in RoomMixin._assigned:
            RoomMixin._assigned[name] = self.devices[len(RoomMixin._assigned) % len(self.devices)]
        return RoomMixin._assigned[name]

    def learner_folder(self) -> Path:
        return Path(self.format_string(self.notebook_dir or "~")).expanduser()

    def room_env_for(self, name: str) -> dict:
        room = Path(self.room).expanduser().resolve()
        room.mkdir(parents=True, exist_ok=True)
        env = {"GPULAB_RESULTS": str(room / f"{name}.json"), "GPULAB_LEARNER": name, **self.room_env}
        device = self.device_for(name)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        if self.profile:
            env["GPULAB_PROFILE"] = self.profile
        return env

    def get_env(self):
        env = super().get_env()
        env.update(self.room_env_for(self.user.name))
        return env

    async def start(self):
        working_copy(Path(self.lessons), self.learner_folder())
        return await super().start()


class RoomSpawner(RoomMixin, LocalProcessSpawner):
    """A learner's server as their own system user (set `notebook_dir = "~/gpulab"`)."""


class SimpleRoomSpawner(RoomMixin, SimpleLocalProcessSpawner):
    """Every learner's server as the hub's user, each in `home_dir_template` (default /tmp/{username})."""

    def learner_folder(self) -> Path:
        return Path(self.home_dir)
