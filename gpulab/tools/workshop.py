"""JupyterHub spawners for a workshop room on one GPU server (`workshop/jupyterhub_config.py` uses them).

Each learner's server is started with:

- a GPU of its own, or a MIG slice, or a share of one: `CUDA_VISIBLE_DEVICES` set to the next entry of
  `devices` (GPU indices like "0", in `nvidia-smi`'s order, or MIG UUIDs like "MIG-0b5c...", as
  `nvidia-smi -L` lists them), learners assigned in the order they first start, round robin. A device
  handed out to a second learner is shared: their records are marked so (GPULAB_SHARED_GPU).
- the course's working copy made for them: the lessons of `notebooks/` copied into their own folder on
  first start (never overwritten later), owned by them, as `bash setup.sh lab` does for one learner.
- their results store in the room folder: `GPULAB_ROOM` and `GPULAB_LEARNER` (gpulab.core.results names
  the file), which the instructor watches with `gpulab room <room> --learners --watch 10`.
- a GPU profile if the room asks for one (`profile`, e.g. a MIG slice emulated on a whole GPU).

`RoomSpawner` starts each server as the learner's own system user (JupyterHub's LocalProcessSpawner:
learners are accounts on the server; the hub runs as root). `SimpleRoomSpawner` starts them all as the
hub's user, each in its own folder: one account, so learners can read each other's files (a trusted
room, or the CPU load test in tests/workshop).

Importing this module needs JupyterHub (`bash setup.sh hub` installs it); the rest of gpulab does not.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from traitlets import Dict, HasTraits, List, Unicode

from gpulab.core.results import room_file

REPO = Path(__file__).resolve().parents[2]


def working_copy(lessons: Path, folder: Path, owner: tuple[int, int] | None = None) -> list[str]:
    """Copy every lesson of `lessons` that `folder` lacks into it (the learner's edits are never
    overwritten), owned by `owner` (uid, gid) where given; returns the names copied."""
    new_folder = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    if owner is not None and new_folder:
        os.chown(folder, *owner)
    copied = []
    for src in sorted(lessons.glob("*.ipynb")):
        dst = folder / src.name
        if not dst.exists():
            shutil.copyfile(src, dst)
            if owner is not None:
                os.chown(dst, *owner)
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

    def sharing(self, name: str) -> int:
        """How many learners hold `name`'s device (1: it is theirs alone)."""
        device = self.device_for(name)
        return sum(1 for d in RoomMixin._assigned.values() if d == device) if device is not None else 0

    def owner(self) -> tuple[int, int] | None:
        """(uid, gid) the learner's files belong to; None where servers run as the hub's user."""
        return None

    def learner_folder(self) -> Path:
        raise NotImplementedError

    def room_folder(self) -> Path:
        room = Path(self.room).expanduser().resolve()
        if not room.exists():
            room.mkdir(parents=True)
            if self.owner() is not None:        # learners of several accounts write there: sticky, like /tmp
                os.chmod(room, 0o1777)
        return room

    def room_env_for(self, name: str) -> dict:
        env = {"GPULAB_ROOM": str(self.room_folder()), "GPULAB_LEARNER": name,
               "GPULAB_RESULTS": str(self.room_folder() / room_file(name)), **self.room_env}
        device = self.device_for(name)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"           # indices as nvidia-smi numbers the GPUs
            if self.sharing(name) > 1:
                env["GPULAB_SHARED_GPU"] = f"{device} handed to {self.sharing(name)} learners"
        if self.profile:
            env["GPULAB_PROFILE"] = self.profile
        return env

    def get_env(self):
        env = super().get_env()
        env.update(self.room_env_for(self.user.name))
        return env

    async def start(self):
        working_copy(Path(self.lessons), self.learner_folder(), self.owner())
        return await super().start()


class RoomSpawner(RoomMixin, LocalProcessSpawner):
    """A learner's server as their own system user; their lessons in ~/gpulab (set notebook_dir to it)."""

    def _account(self):
        import pwd
        return pwd.getpwnam(self.user.name)

    def owner(self) -> tuple[int, int] | None:
        a = self._account()
        return a.pw_uid, a.pw_gid

    def learner_folder(self) -> Path:
        return Path(self._account().pw_dir) / "gpulab"


class SimpleRoomSpawner(RoomMixin, SimpleLocalProcessSpawner):
    """Every learner's server as the hub's user, each in `home_dir_template`."""

    def learner_folder(self) -> Path:
        return Path(self.home_dir)
