# JupyterHub for a gpulab workshop on one GPU server: `bash setup.sh hub` starts it with this file.
#
# Every learner logs in at http://<server>:8000 (a shared workshop password, GPULAB_HUB_PASSWORD), gets a
# JupyterLab of their own with the course's working copy, and a GPU, a MIG slice or a share of one
# (`devices` below); their results go to the room folder, which you watch with
#     gpulab room room/ --learners --watch
# See README.md, "Running a workshop", for the steps from an empty server to a room.
import os

from gpulab.workshop import RoomSpawner, SimpleRoomSpawner

c = get_config()  # noqa: F821 - JupyterHub provides it

c.JupyterHub.bind_url = os.environ.get("GPULAB_HUB_URL", "http://0.0.0.0:8000")
c.JupyterHub.db_url = "sqlite:///" + os.environ.get("GPULAB_HUB_DB", "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.environ.get("GPULAB_HUB_SECRET", "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = True            # stopping the hub stops every learner's server
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120

# Learners: accounts on this server (RoomSpawner starts each server as its user) or, on a machine with
# one account, folders under /tmp (SimpleRoomSpawner). GPULAB_HUB_ACCOUNTS=1 picks the first.
if os.environ.get("GPULAB_HUB_ACCOUNTS") == "1":
    c.JupyterHub.authenticator_class = "pam"
    c.JupyterHub.spawner_class = RoomSpawner
    c.RoomSpawner.notebook_dir = "~/gpulab"
else:
    c.JupyterHub.authenticator_class = "dummy"   # any name, one shared password
    c.DummyAuthenticator.password = os.environ.get("GPULAB_HUB_PASSWORD", "")
    c.JupyterHub.spawner_class = SimpleRoomSpawner
    c.SimpleRoomSpawner.home_dir_template = os.environ.get("GPULAB_HUB_HOMES", "/tmp/gpulab-learners") + "/{username}"
    if os.getuid() == 0:        # a container's root: the servers run as the hub's user, so as root too
        c.SimpleRoomSpawner.args = ["--allow-root"]
c.Authenticator.allow_all = True

# Devices handed out in turn, one per learner: GPU indices ("0,1,2,3") or MIG UUIDs (`nvidia-smi -L`
# lists them: "MIG-..."). One entry per slice; more learners than entries share (time-slicing).
devices = os.environ.get("GPULAB_HUB_DEVICES", "")
for cls in ("RoomSpawner", "SimpleRoomSpawner"):
    c[cls].devices = [d.strip() for d in devices.split(",") if d.strip()]
    c[cls].room = os.environ.get("GPULAB_ROOM", "room")
    c[cls].profile = os.environ.get("GPULAB_HUB_PROFILE", "")     # e.g. emulate a MIG 1g slice on whole GPUs
