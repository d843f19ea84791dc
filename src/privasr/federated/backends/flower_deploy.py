"""The Flower backend's deployment mode: a real SuperLink and SuperNodes on loopback, over TLS, with registered
SuperNodes, each serving one client from its own data folder.

:func:`~privasr.federated.backends.flower.run_flower` with ``mode="deployment"`` calls :func:`_run_deployment`,
which stands up on this machine what a real federation runs on many:

* the clients are split into one folder per SuperNode (:func:`~privasr.federated.client_store.split_clients`,
  ``<work>/data/client-<i>/``, standing for each device's own disk); a SuperNode is told its folder, and its
  state folder, through its node config (:func:`supernode_config`), and its ClientApp reads only that folder;
* credentials are made with :func:`~privasr.federated.credentials.make_credentials` (a private CA, the SuperLink's
  certificate for ``127.0.0.1`` and ``localhost``, one P-384 key pair per SuperNode);
* ``flower-superlink`` starts with TLS and ``--enable-supernode-auth``; each SuperNode's public key is
  registered (``flwr supernode register``) before ``flower-supernode`` starts with ``--root-certificates`` and
  its private key. A SuperNode whose key was not registered is refused by the SuperLink;
* a generated Flower app (a tiny package that imports privasr) is submitted with ``flwr run``: its ServerApp
  reads the pickled server spec (algorithm, sampler, settings: no client data) and its ClientApp the pickled
  algorithm (the public model and settings: no client data either).

Every process is stopped when the run ends, also on failure. After a failure only the logs are kept: the
pickles, the data folders and every private key (the CA's too) are deleted. Private keys are passed to the
processes as file paths and never written into a log.

>>> supernode_config(2, 3, "/dev1/data")
"partition-id=2 num-partitions=3 privasr-data-dir='/dev1/data'"
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privasr.errors import ConfigError, InputError
from privasr.federated.client_store import split_clients
from privasr.federated.core import FederatedError
from privasr.federated.credentials import Credentials, make_credentials
from privasr.federated.loop import FederatedResult

__all__ = ["supernode_config", "STATE_DIR_KEY", "DATA_DIR_KEY", "ALGORITHM_KEY", "LOOPBACK_HOSTS"]

log = logging.getLogger("privasr.federated")

STATE_DIR_KEY = "privasr-state-dir"
"""The node-config key of a SuperNode's own state folder (where a checkpointed run keeps its client's states)."""
DATA_DIR_KEY = "privasr-data-dir"
"""The node-config key of a SuperNode's own data folder (a :func:`~privasr.federated.client_store.save_client`
folder: the one client it serves)."""
ALGORITHM_KEY = "privasr-algorithm"
"""The node-config key of the path of the pickled algorithm on a SuperNode's machine (default: the path the
generated app was written with, which is right on the machine that wrote it)."""
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
"""The names the loopback SuperLink's certificate is made for."""


def supernode_config(index: int, n: int, data_dir: str | os.PathLike[str] | None = None,
                     state_dir: str | os.PathLike[str] | None = None,
                     algorithm: str | os.PathLike[str] | None = None) -> str:
    """The ``flower-supernode --node-config`` value of the SuperNode serving client ``index`` of ``n``.

    Raises:
        ConfigError: a folder whose path holds a quote or a line break (Flower's node config cannot carry it).

    >>> supernode_config(0, 3, "/data/privasr/client-0", "/var/lib/privasr")
    "partition-id=0 num-partitions=3 privasr-data-dir='/data/privasr/client-0' privasr-state-dir='/var/lib/privasr'"
    """
    parts = [f"partition-id={int(index)}", f"num-partitions={int(n)}"]
    for key, folder in ((DATA_DIR_KEY, data_dir), (STATE_DIR_KEY, state_dir), (ALGORITHM_KEY, algorithm)):
        if folder is None:
            continue
        if any(c in str(folder) for c in "'\n\r"):
            raise ConfigError(f"{key}={str(folder)!r}", expected="a path without quotes or line breaks")
        parts.append(f"{key}='{folder}'")
    return " ".join(parts)


def _dump(path: Path, obj: Any) -> None:
    """Pickle ``obj`` to ``path`` with Ray's cloudpickle (classes of test modules and scripts by value)."""
    try:
        from ray import cloudpickle as pickler
    except ImportError:  # pragma: no cover - Flower's simulation needs Ray anyway
        pickler = pickle  # type: ignore[assignment]
    with open(path, "wb") as f:
        pickler.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


# -- the generated app and Flower's configuration ------------------------------------------------------------------

_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "privasr-flower-app"
version = "1.0.0"
description = "A privasr federated run (generated by privasr.federated.backends.flower_deploy)"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "privasr"

[tool.flwr.app.components]
serverapp = "privasr_flower_app.server_app:app"
clientapp = "privasr_flower_app.client_app:app"

[tool.flwr.app.config]
kit = ""
"""

_FLWR_CONFIG = """\
[superlink]
default = "privasr"

[superlink.privasr]
address = {address}
root-certificates = {ca}
"""


@dataclass(frozen=True)
class _Workdir:
    """The temporary folder of a deployment run."""

    work: Path

    @property
    def home(self) -> Path:
        """``FLWR_HOME`` (``config.toml`` with the ``privasr`` connection)."""
        return self.work / "home"

    @property
    def app(self) -> Path:
        """The generated Flower app."""
        return self.work / "app"

    @property
    def logs(self) -> Path:
        """One log per process."""
        return self.work / "logs"

    @property
    def data(self) -> Path:
        """The clients' folders, ``client-<i>``: each SuperNode's own data."""
        return self.work / "data"

    @property
    def credentials(self) -> Path:
        """The CA, the SuperLink's certificate and the SuperNodes' keys."""
        return self.work / "credentials"

    @property
    def algorithm(self) -> Path:
        """The pickled ``(algorithm, None)`` the ClientApp loads (no client data)."""
        return self.work / "algorithm.pkl"

    @property
    def spec(self) -> Path:
        """The pickled server spec the ServerApp loads (no client data)."""
        return self.work / "server.pkl"

    @property
    def result(self) -> Path:
        """The pickled outcome the ServerApp writes."""
        return self.work / "result.pkl"


def _write_app(wd: _Workdir, spec: Any) -> None:
    """Write the pickled server spec and algorithm and the Flower app (pyproject, ServerApp and ClientApp modules
    that load them) under ``wd``."""
    pkg = wd.app / "privasr_flower_app"
    for d in (wd.home, pkg, wd.logs):
        d.mkdir(parents=True, exist_ok=True)
    _dump(wd.algorithm, (spec.algorithm, None))
    _dump(wd.spec, spec)
    (wd.app / "pyproject.toml").write_text(_PYPROJECT)
    (pkg / "__init__.py").write_text('"""A privasr federated run (generated)."""\n')
    (pkg / "server_app.py").write_text("from privasr.federated.backends.flower import deployment_server_app\n\n"
                                       f"app = deployment_server_app({str(wd.spec)!r}, {str(wd.result)!r})\n")
    (pkg / "client_app.py").write_text("from privasr.federated.backends.flower import make_client_app\n\n"
                                       f"app = make_client_app({str(wd.algorithm)!r}, "
                                       f"secure={getattr(spec, 'secagg', None) is not None})\n")


def _write_flwr_config(wd: _Workdir, port: int, creds: Credentials, home: Path | None = None,
                       host: str = "127.0.0.1") -> None:
    """``FLWR_HOME/config.toml`` (``home``, default ``wd.home``): the ``privasr`` connection to the SuperLink at
    ``host:port`` (loopback by default), verified with the CA."""
    home = wd.home if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    (home / "config.toml").write_text(_FLWR_CONFIG.format(address=json.dumps(address),
                                                          ca=json.dumps(str(creds.ca_cert))))


def _deployment_env(home: Path) -> dict[str, str]:
    """The environment of Flower's processes: this Python's tools and privasr first, telemetry off."""
    env = dict(os.environ)

    def path_list(first: list[str], var: str) -> str:
        return os.pathsep.join(first + ([env[var]] if env.get(var) else []))

    env.update({"FLWR_HOME": str(home),
                "FLWR_TELEMETRY_ENABLED": env.get("FLWR_TELEMETRY_ENABLED", "0"),
                "RAY_USAGE_STATS_ENABLED": env.get("RAY_USAGE_STATS_ENABLED", "0"),
                "PATH": path_list([str(Path(sys.executable).parent)], "PATH"),  # the SuperLink runs flower-superexec
                "PYTHONPATH": path_list([p for p in sys.path if p], "PYTHONPATH")})  # the same privasr everywhere
    return env


# -- processes -----------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(f"{name} is not installed", expected="pip install 'privasr[federated]'")
    return found


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


RUN_TOKEN = "PRIVASR_RUN_TOKEN"
"""The environment variable that marks every process a launcher starts, and every process those start."""

_JANITOR = """
import os, signal, sys
token, me = sys.argv[1], os.getpid()
sys.stdin.buffer.read()  # returns when the launcher closes the pipe or dies, however it dies
for _ in range(3):
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                marked = (f"{sys.argv[2]}=" + token).encode() in f.read().split(b"\\0")
        except OSError:
            continue
        if marked:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
"""


def _sweep(token: str) -> list[int]:
    """SIGKILL every process whose environment carries ``PRIVASR_RUN_TOKEN=token``; their pids."""
    want = f"{RUN_TOKEN}={token}".encode()
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        _signal(int(entry), signal.SIGKILL)
        killed.append(int(entry))
    return killed


class _Processes:
    """Processes started in their own sessions, stopped together (process group: TERM, then KILL).

    Every process started here, and every process those start (Flower's SuperExec, ServerApp and ClientApp
    processes, which detach or outlive their parents), carries ``PRIVASR_RUN_TOKEN=<this run's token>`` in its
    environment. A *janitor* process, started first in a session of its own, waits on a pipe from the launcher;
    when the launcher ends -- normally, by an exception or killed with SIGKILL -- the pipe closes and the janitor
    kills every process carrying the token. So no process of a run outlives its launcher.
    """

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        import secrets

        self.token = secrets.token_hex(16)
        self.env = {**env, RUN_TOKEN: self.token}
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.restartable: dict[str, list[str]] = {}  # name -> argv of processes started again when they die
        self.restarts: dict[str, int] = {}
        self.janitor: subprocess.Popen[bytes] | None = None
        if os.path.isdir("/proc"):
            clean = {k: v for k, v in env.items() if k != RUN_TOKEN}  # the janitor is not marked itself
            self.janitor = subprocess.Popen([sys.executable, "-c", _JANITOR, self.token, RUN_TOKEN],
                                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True, env=clean)

    def start(self, name: str, argv: list[str], *, restart: bool = False) -> subprocess.Popen[bytes]:
        """Start ``argv`` as ``name`` (its output in ``logs/<name>.log``, appended to after a restart).
        ``restart``: a process that may die (a device's own process, as a phone's app): :meth:`check` starts it
        again instead of failing the run."""
        mode = "ab" if name in self.restarts else "wb"
        with open(self.logs / f"{name}.log", mode) as out:
            proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.logs,
                                    preexec_fn=_die_with_parent)
        self.procs.append((name, proc))
        if restart:
            self.restartable[name] = list(argv)
        return proc

    def check(self) -> None:
        """Fail if a process died; a restartable one is started again (logged), up to 5 times."""
        for name, proc in list(self.procs):
            if proc.poll() is None:
                continue
            if name in self.restartable and self.restarts.get(name, 0) < 5:
                self.restarts[name] = self.restarts.get(name, 0) + 1
                log.warning("%s exited with status %s; starting it again (%d)", name, proc.returncode,
                            self.restarts[name])
                self.procs.remove((name, proc))
                self.start(name, self.restartable[name], restart=True)
                continue
            raise FederatedError(f"{name} exited with status {proc.returncode}:\n"
                                 f"{_tail(self.logs / f'{name}.log')}")

    def stop(self, grace: float = 5.0) -> None:
        """TERM every process, its group and its descendants (SuperExec detaches itself); KILL what is left."""
        family = {pid for _, proc in self.procs for pid in _descendants(proc.pid)}
        for _, proc in self.procs:
            _signal_group(proc.pid, signal.SIGTERM)
        for pid in family:
            _signal(pid, signal.SIGTERM)
        end = time.monotonic() + grace
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        family |= {pid for _, proc in self.procs for pid in _descendants(proc.pid)}
        for _, proc in self.procs:
            _signal_group(proc.pid, signal.SIGKILL)
        for pid in family:
            _signal(pid, signal.SIGKILL)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        _sweep(self.token)  # what detached itself from the tree (Flower's app processes)
        self.procs = []
        if self.janitor is not None:
            assert self.janitor.stdin is not None
            self.janitor.stdin.close()
            try:
                self.janitor.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self.janitor.kill()
            self.janitor = None


class KitLock:
    """An exclusive lock on a kit (``KIT/.lock``, ``flock``): held while a run of the kit is going; released by
    the kernel when the holder dies, however it dies."""

    def __init__(self, kit: Path) -> None:
        self.path = kit / ".lock"
        self.fh: Any = None

    def __enter__(self) -> KitLock:
        self.fh = open(self.path, "a+")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "another process"
            self.fh.close()
            raise ConfigError(f"{self.path.parent} is being run by {holder}",
                              expected="one run of a kit at a time (stop the other run first)") from None
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}\n")
        self.fh.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _die_with_parent() -> None:
    """In a child before ``exec``: have the kernel send it SIGTERM when its parent (the launcher) dies, even by
    SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing). Flower's processes pass the watch on: the
    SuperLink's and SuperNode's own children watch their parent's pid."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _descendants(pid: int) -> set[int]:
    """The pids of ``pid``'s living descendants (from ``/proc``; empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # started with start_new_session: the group id is the leader's pid
    except (ProcessLookupError, PermissionError):
        pass


def _wait_port(port: int, procs: _Processes, wait: float) -> None:
    deadline = time.monotonic() + wait
    while True:
        procs.check()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise FederatedError(f"the SuperLink did not listen on 127.0.0.1:{port} within {wait:g} s") from None
            time.sleep(0.1)


def _flwr_cli(args: list[str], env: dict[str, str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``flwr ARGS`` against the ``privasr`` connection of ``env``'s ``FLWR_HOME``."""
    return subprocess.run([_tool("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout)


# -- the federation ------------------------------------------------------------------------------------------------


def _start_superlink(procs: _Processes, port: int, creds: Credentials, wait: float = 60.0) -> None:
    """Start ``flower-superlink`` with TLS and SuperNode authentication on ``127.0.0.1:port``; wait until it
    listens."""
    procs.start("superlink", [_tool("flower-superlink"), *creds.superlink_args(),
                              "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port)])
    _wait_port(port, procs, wait)


def _register_nodes(procs: _Processes, public_keys: Sequence[Path], wait: float = 60.0) -> list[int]:
    """Register SuperNodes' public keys with the SuperLink (``flwr supernode register``, one process per key, side
    by side), retrying those that fail until the SuperLink answers; the node ids it gives, in order."""
    deadline = time.monotonic() + wait
    ids: dict[int, int] = {}
    last = ""
    while True:
        procs.check()
        pending = {i: subprocess.Popen([_tool("flwr"), "supernode", "register", str(key), "privasr", "--format",
                                        "json"], env=procs.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True)
                   for i, key in enumerate(public_keys) if i not in ids}
        for i, proc in pending.items():
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            try:
                ids[i] = int(json.loads(out)["node-id"])
            except (ValueError, KeyError, TypeError):
                last = f"{public_keys[i]}:\n{out[-1000:]}\n{err[-1000:]}"
        if len(ids) == len(public_keys):
            return [ids[i] for i in range(len(public_keys))]
        if time.monotonic() >= deadline:
            raise FederatedError(f"could not register {len(public_keys) - len(ids)} SuperNode key(s) with the "
                                 f"SuperLink within {wait:g} s; the last answer, for {last}")
        time.sleep(0.5)


def _start_supernode(procs: _Processes, name: str, port: int, auth_args: Sequence[str], node_config: str) -> None:
    """Start ``flower-supernode`` connecting to the SuperLink on ``127.0.0.1:port`` over TLS, signing with its key
    (``auth_args``: :meth:`~privasr.federated.credentials.Credentials.supernode_args`)."""
    procs.start(name, [_tool("flower-supernode"), *auth_args, "--superlink", f"127.0.0.1:{port}",
                       "--host", "127.0.0.1", "--port", str(_free_port()), "--node-config", node_config])


def _start_federation(procs: _Processes, port: int, creds: Credentials, data_dirs: Sequence[Path],
                      nodes_dir: Path | None, algorithm: Path | None = None) -> None:
    """Start the SuperLink, register the SuperNodes' keys and start one SuperNode per client folder
    (``algorithm``: where the nodes find the pickled algorithm, when not where the app was written)."""
    _start_superlink(procs, port, creds)
    n = len(data_dirs)
    _register_nodes(procs, creds.node_public_keys[:n])
    for i, folder in enumerate(data_dirs):
        _start_supernode(procs, f"supernode-{i}", port, creds.supernode_args(i),
                         supernode_config(i, n, folder, nodes_dir, algorithm))


def _flwr_run(app: Path, env: dict[str, str], kit: Path | None = None) -> str:
    """``flwr run`` the app on the local SuperLink (``kit``: the kit's folder, passed in the run config so that
    the ServerApp finds its files wherever the kit is); its run id."""
    extra = [] if kit is None else ["--run-config", f"kit='{kit}'"]
    started = _flwr_cli(["run", str(app), "privasr", *extra, "--format", "json"], env)
    try:
        return str(json.loads(started.stdout)["run-id"])
    except (ValueError, KeyError, TypeError):
        raise FederatedError(f"flwr run failed (status {started.returncode}):\n{started.stdout[-2000:]}\n"
                             f"{started.stderr[-2000:]}") from None


def _run_status(env: dict[str, str], run_id: str) -> str:
    """The SuperLink's status of run ``run_id`` (``"running"``, ``"finished:failed"``, ...), or ``""``."""
    try:
        res = _flwr_cli(["ls", "privasr", "--run-id", run_id, "--format", "json"], env, 60.0)
        runs = json.loads(res.stdout).get("runs", [])
        return str(runs[0].get("status", "")) if runs else ""
    except (OSError, ValueError, subprocess.TimeoutExpired, IndexError, AttributeError):
        return ""


def _wait_for_result(wd: _Workdir, procs: _Processes, env: dict[str, str], run_id: str,
                     run_timeout: float | None, progress: Any = None) -> None:
    """Wait until the ServerApp has written its outcome; fail when a process dies, the run takes longer than
    ``run_timeout`` or the SuperLink says it finished without one (asked every 10 s). ``progress(done)`` is
    called when the checkpoint (``wd.work/checkpoint``) shows another finished round."""
    from privasr.federated.tree import load_tree

    def rounds_done(path: Path) -> int:
        try:
            return int(load_tree(path)["round"])
        except (InputError, KeyError, TypeError, ValueError):  # being replaced: the next look reads it
            return -1

    t0 = time.monotonic()
    next_status = t0 + 10.0
    ckpt = wd.work / "checkpoint" / "state.npz"
    seen = (-1.0, -1)
    while not wd.result.exists():
        procs.check()
        if progress is not None and ckpt.exists():
            mtime = ckpt.stat().st_mtime
            if mtime != seen[0]:
                done = rounds_done(ckpt)
                if done >= 0:
                    seen = (mtime, done)
                    progress(done)
        now = time.monotonic()
        if run_timeout is not None and now - t0 > run_timeout:
            raise FederatedError(f"the Flower run took longer than {run_timeout:g} s (logs in {wd.logs})")
        if now >= next_status:
            status = _run_status(env, run_id)
            if status.startswith("finished") and not wd.result.exists():
                # the ServerApp writes its result (or its own error) before it ends: it was killed or crashed
                raise FederatedError(f"the ServerApp ended ({status}) without writing its result or its error: "
                                     "its process was killed or died (run the kit again to continue from the "
                                     f"last checkpointed round; logs in {wd.logs})")
            next_status = time.monotonic() + 10.0
        time.sleep(0.1)


def _keep_only_logs(wd: _Workdir) -> bool:
    """Delete everything in the work folder but the logs: pickles, client data, credentials with every private
    key. The whole folder goes if no process wrote a log. Whether logs were kept."""
    has_logs = wd.logs.is_dir() and any(wd.logs.iterdir())
    if not has_logs:
        shutil.rmtree(wd.work, ignore_errors=True)
        return False
    for p in wd.work.iterdir():
        if p == wd.logs:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return True


def _execute(wd: _Workdir, data_dirs: Sequence[Path], creds: Credentials, nodes_dir: Path | None, *,
             run_timeout: float | None, home: Path | None = None, kit: bool = False,
             progress: Any = None) -> dict[str, Any]:
    """Run the app written in ``wd`` on loopback: the SuperLink on a free port, one SuperNode per data folder,
    ``flwr run``; stop every process; the ServerApp's outcome (``{"ok": True, "result": ..., "accountant":
    ...}``). ``home``: the ``FLWR_HOME`` to use (default ``wd.home``)."""
    home = wd.home if home is None else home
    port = _free_port()
    _write_flwr_config(wd, port, creds, home)
    env = _deployment_env(home)
    wd.logs.mkdir(parents=True, exist_ok=True)
    procs = _Processes(env, wd.logs)
    try:
        _start_federation(procs, port, creds, data_dirs, nodes_dir, wd.algorithm if kit else None)
        run_id = _flwr_run(wd.app, env, wd.work if kit else None)
        log.info("flower deployment run %s started (work folder %s)", run_id, wd.work)
        _wait_for_result(wd, procs, env, run_id, run_timeout, progress)
        with open(wd.result, "rb") as f:
            outcome: dict[str, Any] = pickle.load(f)  # noqa: S301 - written by our own ServerApp
        return outcome
    finally:
        procs.stop()


def _result_of(outcome: dict[str, Any], privacy: Any) -> FederatedResult:
    """The run's result from the ServerApp's outcome (its accountant loaded into ``privacy``), or the error."""
    if not outcome["ok"]:
        if outcome["federated"]:
            raise FederatedError(outcome["message"])
        raise FederatedError(f"the ServerApp failed: {outcome['error']}\n{outcome['traceback']}")
    if privacy is not None and outcome["accountant"] is not None:
        privacy.accountant.load_state_dict(outcome["accountant"])
    return outcome["result"]  # type: ignore[no-any-return]


def _run_deployment(spec: Any, clients: list[Any], nodes_dir: Path | None, *, run_timeout: float | None,
                    keep_workdir: bool) -> FederatedResult:
    """Run ``spec`` (the flower module's server spec) over ``clients`` on loopback (see the module docstring);
    clean up, keeping only the logs of a run that failed in Flower (or everything with ``keep_workdir``)."""
    wd = _Workdir(Path(tempfile.mkdtemp(prefix="privasr-flower-")))
    clean = False  # remove the whole folder at the end (else everything but the logs)
    try:
        data_dirs = split_clients(clients, wd.data)  # each SuperNode's own disk
        _write_app(wd, spec)
        creds = make_credentials(wd.credentials, nodes=len(clients), hosts=LOOPBACK_HOSTS)
        outcome = _execute(wd, data_dirs, creds, nodes_dir, run_timeout=run_timeout)
        # a run that failed by itself (e.g. too few clients), not in Flower, has no logs worth keeping
        clean = outcome["ok"] or bool(outcome["federated"])
        return _result_of(outcome, spec.privacy)
    finally:
        if keep_workdir:
            pass
        elif clean:
            shutil.rmtree(wd.work, ignore_errors=True)
        elif _keep_only_logs(wd):
            log.warning("the flower deployment failed; its logs are in %s", wd.logs)
