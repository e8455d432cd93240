"""The room's spawner settings without a hub running: devices handed out in turn, the working copy made
once and never overwritten, each learner's results store in the room folder."""
import pytest

pytest.importorskip("jupyterhub", reason="bash setup.sh test installs JupyterHub")

from gpulab.tools import workshop as W  # noqa: E402


def test_devices_go_round_robin_and_stay_with_their_learner(monkeypatch):
    monkeypatch.setattr(W.RoomMixin, "_assigned", {})
    s = W.SimpleRoomSpawner(devices=["MIG-a", "MIG-b", "MIG-c"])
    got = [s.device_for(n) for n in ("ann", "bob", "cy", "dee", "ann")]
    assert got == ["MIG-a", "MIG-b", "MIG-c", "MIG-a", "MIG-a"]       # dee shares MIG-a with ann
    assert W.SimpleRoomSpawner().device_for("eve") is None             # no devices: every GPU visible


def test_each_learner_writes_to_the_room_with_the_rooms_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(W.RoomMixin, "_assigned", {})
    s = W.SimpleRoomSpawner(devices=["0"], room=str(tmp_path / "room"), profile="h200-1g",
                            room_env={"GPULAB_SCALE": "tiny"})
    env = s.room_env_for("ann")
    assert env["GPULAB_RESULTS"] == str((tmp_path / "room" / "ann.json").resolve())
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["GPULAB_PROFILE"] == "h200-1g"
    assert env["GPULAB_SCALE"] == "tiny" and env["GPULAB_LEARNER"] == "ann" and (tmp_path / "room").is_dir()
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "GPULAB_SHARED_GPU" not in env
    # a second learner on the only device: both marked shared from then on
    assert s.room_env_for("bob")["GPULAB_SHARED_GPU"] == "0 handed to 2 learners"
    assert s.room_env_for("a/../b")["GPULAB_RESULTS"].endswith("a_.._b.json")


def test_the_working_copy_is_made_once_and_never_overwritten(tmp_path):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    (lessons / "00_a.ipynb").write_text("clean 00")
    (lessons / "01_b.ipynb").write_text("clean 01")
    mine = tmp_path / "ann"
    import os
    assert W.working_copy(lessons, mine, owner=(os.getuid(), os.getgid())) == ["00_a.ipynb", "01_b.ipynb"]
    (mine / "00_a.ipynb").write_text("my edits")
    (lessons / "02_c.ipynb").write_text("clean 02")
    assert W.working_copy(lessons, mine) == ["02_c.ipynb"]
    assert (mine / "00_a.ipynb").read_text() == "my edits"


def test_an_accounts_room_copies_into_the_learners_home_as_theirs(monkeypatch, tmp_path):
    import os
    import pwd

    me = pwd.getpwuid(os.getuid())

    class Account:
        pw_uid, pw_gid = me.pw_uid, me.pw_gid

        def __init__(self, name):
            self.pw_dir = str(tmp_path / name)
    monkeypatch.setattr(pwd, "getpwnam", Account)
    s = W.RoomSpawner(room=str(tmp_path / "room"))
    s.user = type("U", (), {"name": "ann"})()
    assert s.learner_folder() == tmp_path / "ann" / "gpulab" and s.owner() == (me.pw_uid, me.pw_gid)
    s.room_env_for("ann")
    assert oct((tmp_path / "room").stat().st_mode & 0o7777) == "0o1777"     # every account writes there
