# JupyterHub for a gpulab workshop on one GPU server: `bash setup.sh hub` starts it with this file.
#
# Every learner logs in at http://<server>:8000, gets a JupyterLab of their own with the course's working
# copy, and a GPU, a MIG slice or a share of one (GPULAB_HUB_DEVICES); their results go to the room
# folder, which you watch with
#     .venv/bin/gpulab room room/ --learners --watch 10
# See docs/instructors.md, "Running a workshop", for the steps from an empty server to a room. Plain HTTP: put it
# behind a TLS reverse proxy, or set c.JupyterHub.ssl_cert / ssl_key, before passwords cross a network.
import os

from gpulab.tools.workshop import RoomSpawner, SimpleRoomSpawner

c = get_config()  # noqa: F821 - JupyterHub provides it

c.JupyterHub.bind_url = os.environ.get("GPULAB_HUB_URL", "http://0.0.0.0:8000")
c.JupyterHub.db_url = "sqlite:///" + os.environ.get("GPULAB_HUB_DB", "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.environ.get("GPULAB_HUB_SECRET", "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = True            # stopping the hub stops every learner's server
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
# After a server's process has started, how long the hub waits for it to answer HTTP before it gives the spawn up
# (JupyterHub's default is 30 s). A room's servers start at once: in tests/workshop/test_hub_load.py eight on two
# busy cores came close to 30 s, and one past it failed a CI run (2026-12-07).
c.Spawner.http_timeout = 120
# A learner's kernel whose port was taken between being chosen and being bound (by any process on the server: an
# outgoing connection draws its port from the same range) dies at start, and the server retries it five times "with
# new random ports". With jupyter_client's port cache (on by default, 8.10) every retry reuses the same five ports,
# so the kernel never starts and the notebook gets a 404 (tests/workshop/test_hub_load.py, CI, 2026-12-07). Without
# the cache each retry draws new ports.
KERNEL_ARGS = ["--KernelManager.cache_ports=False"]
c.Spawner.args = KERNEL_ARGS

if os.environ.get("GPULAB_HUB_ACCOUNTS") == "1":
    # learners log in with their accounts on this server; each server runs as its learner (the hub as root)
    c.JupyterHub.authenticator_class = "pam"
    c.JupyterHub.spawner_class = RoomSpawner
    c.RoomSpawner.notebook_dir = "~/gpulab"
    groups = [g for g in os.environ.get("GPULAB_HUB_GROUPS", "").split(",") if g]
    if groups:
        c.PAMAuthenticator.allowed_groups = set(groups)     # e.g. a "workshop" group, not every account
    else:
        c.Authenticator.allow_all = True
else:
    # one account: any name and the workshop's shared password; every server runs as the hub's user, so
    # learners can read each other's files (a trusted room)
    password = os.environ.get("GPULAB_HUB_PASSWORD", "")
    if len(password) < 8:
        raise SystemExit("gpulab hub: set GPULAB_HUB_PASSWORD to the workshop's password (8 characters or more)")
    if os.getuid() == 0 and os.environ.get("GPULAB_HUB_ALLOW_ROOT") != "1":
        raise SystemExit("gpulab hub: as root every learner's server would run as root: start the hub as an "
                         "ordinary user, or use accounts (GPULAB_HUB_ACCOUNTS=1), or set GPULAB_HUB_ALLOW_ROOT=1 "
                         "in a throwaway container")
    c.JupyterHub.authenticator_class = "shared-password"
    c.SharedPasswordAuthenticator.user_password = password
    c.Authenticator.allow_all = True
    c.JupyterHub.spawner_class = SimpleRoomSpawner
    c.SimpleRoomSpawner.home_dir_template = os.environ.get("GPULAB_HUB_HOMES", "/srv/gpulab-learners") + "/{username}"
    if os.getuid() == 0:
        c.SimpleRoomSpawner.args = ["--allow-root", *KERNEL_ARGS]

# Devices handed out in turn, one per learner: GPU indices ("0,1,2,3", nvidia-smi's numbering) or MIG
# UUIDs (`nvidia-smi -L` lists them: "MIG-..."). With more learners than entries they share, and their
# records are marked shared. Unset: every learner sees every GPU (and works on GPU 0).
devices = [d.strip() for d in os.environ.get("GPULAB_HUB_DEVICES", "").split(",") if d.strip()]
if not devices:
    print("gpulab hub: GPULAB_HUB_DEVICES is not set: every learner will see every GPU and work on GPU 0")
for cls in ("RoomSpawner", "SimpleRoomSpawner"):
    c[cls].devices = devices
    c[cls].room = os.environ.get("GPULAB_ROOM", "room")
    c[cls].profile = os.environ.get("GPULAB_HUB_PROFILE", "")     # e.g. emulate a MIG 1g slice on whole GPUs
