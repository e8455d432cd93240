"""The kernel manager the tests that run notebooks through nbclient use (tests/ is on sys.path: `from kernels import
PollingKernelManager`; NotebookClient(..., kernel_manager_class=PollingKernelManager)).

Its client waits for a kernel message in polls of POLL_S. pyzmq's asyncio poll can miss the wake-up of a message that
has arrived and find it only when its timeout fires and it polls once more (zmq/_future.py): with nbclient's cell
timeout that was a notebook of tests/test_portability.py waiting about 600 s, then passing, in three fresh-clone runs
of 2026-12-06 (the faulthandler dump of one: the client's event loop in select, nothing due). A miss now costs at
most POLL_S.
"""
import queue
import time

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import Type

POLL_S = 1.0


class PollingChannel(AsyncZMQSocketChannel):
    async def get_msg(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_S if end is None else max(0.0, min(POLL_S, end - time.monotonic()))
            try:
                return await super().get_msg(timeout=left)
            except queue.Empty:
                if end is not None and time.monotonic() >= end:
                    raise


class PollingClient(AsyncKernelClient):
    shell_channel_class = Type(PollingChannel)
    iopub_channel_class = Type(PollingChannel)
    stdin_channel_class = Type(PollingChannel)
    control_channel_class = Type(PollingChannel)


class PollingKernelManager(AsyncKernelManager):
    client_factory = Type(PollingClient)
