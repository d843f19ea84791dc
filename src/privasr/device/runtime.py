"""The device's process next to its SuperNode: privasr's installed ClientApp, for trusted apps only.

A SuperNode started with ``flower-supernode --isolation process`` runs no app itself: it serves its Runtime API
on the device (plain HTTP on loopback, ``--host 127.0.0.1 --port P``) and waits for a process to claim each task.
:func:`serve` is that process (``privasr device serve DEVICE --runtime-api 127.0.0.1:P``), in place of Flower's
``flower-superexec`` + ``flwr-clientapp``:

1. it claims the SuperNode's next ClientApp task (``AcquireTask``) and pulls its message, context, run and FAB;
2. it checks the FAB: its SHA-256 must be one of the app hashes in the device's ``device.json``
   (``trusted_apps``, given by the operator with the bundle's hash). A foreign app's task is answered with an
   error (``refused: app ... is not trusted by this device``) and nothing of the device is opened for it;
3. it never installs the FAB and never imports anything from it: the message is handled by privasr's own
   ClientApp (:meth:`~privasr.device.node.Device.handle`), installed with the package, in this long-lived
   process (the model is built once, not once per message);
4. it pushes the reply and the task's context back (Flower's ``push_message``/``push_task_output``, as
   ``flwr-clientapp`` does), with a heartbeat while it works.

Flower's own ``--trusted-entities`` checks signatures that only apps fetched from Flower Hub carry (a locally
submitted FAB arrives with no verification and is refused), so offline the trust is this hash check. The
functions of Flower's Runtime API used here are those of ``flwr.supernode.runtime.run_clientapp`` in flwr 1.42.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["serve", "handle_task", "REFUSED"]

log = logging.getLogger(__name__)

REFUSED = "refused: app {hash} is not trusted by this device"
"""The reason a device gives for a task of an app whose hash it was not given."""


def _client(address: str, component: str, token: str | None = None) -> Any:
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name=component)]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(server_address=address, insecure=True, root_certificates=None,
                                                 interceptors=interceptors,
                                                 retry_invoker=make_simple_http_retry_invoker())


def handle_task(address: str, token: str, trusted: tuple[str, ...], handler: Callable[[Any, Any], Any]) -> str:
    """Run one claimed task: pull it, check its app, answer it with ``handler(message, context)`` (or refuse),
    push the reply and the context. Returns ``"done"``, ``"refused"`` or ``"failed"``."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    client = _client(address, "flwr-clientapp", token)
    beat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    beat.start()
    message = context = reply = None
    status, details, outcome = SubStatus.FAILED, "", "failed"
    try:
        message, context, run, fab = pull_task_input(client)
        if fab.hash_str not in trusted:
            details = REFUSED.format(hash=fab.hash_str[:16])
            log.warning("%s (run %s)", details, run.run_id)
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
            outcome = "refused"
        else:
            reply = handler(message, context)
            status, outcome = SubStatus.COMPLETED, "done"
    except Exception as e:  # the server sees the type only; the device's log has the details
        log.exception("the ClientApp raised")
        details = f"<class '{type(e).__name__}'>"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        except Exception:  # noqa: BLE001 - the SuperNode is gone or restarting; its task expires
            log.exception("could not push the reply")
            outcome = "failed"
        push_task_output(client=client, context=context, sub_status=status, details=details)
        beat.stop()
        client.close()
    return outcome


def serve(device: Any, address: str, *, poll: float = 0.05, idle: float = 0.5, max_tasks: int | None = None,
          stop: Callable[[], bool] | None = None) -> dict[str, int]:
    """Serve the SuperNode whose Runtime API is at ``address`` with ``device``
    (:class:`~privasr.device.node.Device`) until ``stop()`` says so, ``max_tasks`` tasks were handled, or the
    process is stopped; the counts of tasks done, refused and failed.

    The SuperNode is asked for a task ``poll`` seconds after the last one (SecAgg+'s stages come back to back),
    then ever less often, up to every ``idle`` seconds while nothing comes (Flower's SuperNode itself asks the
    SuperLink every 3 s when idle). The SuperNode may start after this process (connection errors are retried
    the same way, up to 1 s apart).
    """
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
    from flwr.supercore.constant import TaskType

    counts = {"done": 0, "refused": 0, "failed": 0}
    trusted = tuple(device.folder.trusted_apps)
    acquire = _client(address, "SuperExec")
    wait = poll
    try:
        while not (stop is not None and stop()):
            if max_tasks is not None and sum(counts.values()) >= max_tasks:
                break
            try:
                res = acquire.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value],
                                                             agentapp_fab_hashes=[]))
            except Exception:  # noqa: BLE001 - the SuperNode is not up (yet) or restarting
                time.sleep(wait)
                wait = min(1.0, wait * 2)
                continue
            if res.HasField("task") and res.token:
                counts[handle_task(address, res.token, trusted, device.handle)] += 1
                wait = poll
            else:
                time.sleep(wait)
                wait = min(idle, wait * 1.5)
    finally:
        acquire.close()
    return counts
