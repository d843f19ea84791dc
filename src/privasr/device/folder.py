"""A device folder: the user's own raw files in, each used exactly once, in time order, round by round.

Layout (``privasr device init`` writes ``device.json`` and copies the bundle)::

    DEVICE/
      device.json        format, this device's index and name, the bundle's hash, the app hashes it trusts,
                         the inbox
      bundle/            the operator's model bundle (privasr.device.bundle; checked against the hash)
      inbox/             the user's own files, in any N-best format privasr reads (read only: privasr never
                         changes, moves or deletes them); may be another folder (device.json "inbox")
      state/
        ledger.json      which file went into which round, and which were set aside (and why)
        groups/<r>.npz   the utterances prepared from round r's files (NNLM scores, word ids, baseline totals)
        flower/          the client's states between rounds (privasr.federated.backends.flower's node states)

A round ``r`` takes the files that arrived since the last round (:meth:`DeviceFolder.take`), oldest first
(modification time, then name). A file that cannot be read (a format error, an utterance id used before, a
hypothesis without the first-pass scores the bundle needs) is *set aside*: the ledger records it with the
error's file and line, one log line says so, and the round goes on with the rest; if the user replaces it (its
size or modification time changes) a later round takes it again. A file is never taken twice: a file changed
after it was used is logged and left alone. Every write is atomic (a temporary file, then
``os.replace``), groups before the ledger, so a device killed at any point (kill -9) restarts from a consistent
ledger: a group without its ledger entry is simply made again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privasr.errors import ConfigError, InputError
from privasr.federated.tree import load_tree, save_tree

__all__ = ["DeviceFolder", "DEVICE_FORMAT", "DEVICE_VERSION", "init_device"]

log = logging.getLogger(__name__)

DEVICE_FORMAT = "privasr-device"
DEVICE_VERSION = 1
_SKIP = (".tmp", ".part", ".partial", ".crdownload", ".swp", "~")


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def init_device(folder: str | os.PathLike[str], *, bundle: str | os.PathLike[str], bundle_hash: str, index: int,
                name: str | None = None, inbox: str | os.PathLike[str] | None = None,
                trusted_apps: Sequence[str] = ()) -> DeviceFolder:
    """Make a device folder (see the module docstring): copy and check the bundle, write ``device.json``.

    Args:
        folder: a new or empty folder (it may already hold ``inbox/``, the user's files).
        bundle: the operator's bundle folder; ``bundle_hash``: its hash as the operator published it.
        index: this device's client index in the run (its SuperNode's ``partition-id``).
        name: the client's name (default ``device-<index>``); it never leaves the device.
        inbox: the user's files (default ``folder/inbox``).
        trusted_apps: the SHA-256 of every Flower app (FAB) this device will serve.

    Raises:
        ConfigError: a folder already set up, a bad index or app hash.
        InputError: a bundle that fails its checks.
    """
    import shutil

    from privasr.device.bundle import BUNDLE_FILES, read_bundle

    root = Path(folder)
    if (root / "device.json").exists():
        raise ConfigError(f"{root} is already a device folder", expected="a new folder")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"device index {index!r}", expected="an integer >= 0")
    for h in trusted_apps:
        if not isinstance(h, str) or len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise ConfigError(f"app hash {h!r}", expected="a SHA-256 in hex (64 characters)")
    read_bundle(bundle, expected=bundle_hash)
    (root / "bundle").mkdir(parents=True, exist_ok=False)
    for f in BUNDLE_FILES:
        shutil.copyfile(Path(bundle) / f, root / "bundle" / f)
    read_bundle(root / "bundle", expected=bundle_hash)
    box = Path(inbox) if inbox is not None else root / "inbox"
    box.mkdir(parents=True, exist_ok=True)
    _write_json(root / "device.json", {"format": DEVICE_FORMAT, "version": DEVICE_VERSION, "index": index,
                                       "name": name or f"device-{index}", "bundle": bundle_hash,
                                       "trusted_apps": list(trusted_apps),
                                       "inbox": str(box.resolve()) if inbox is not None else "inbox"})
    (root / "state").mkdir(exist_ok=True)
    return DeviceFolder(root)


@dataclass
class Taken:
    """What one round took from the inbox: the prepared group and the files used and set aside."""

    round: int
    group: list[dict[str, Any]]
    used: list[str]
    set_aside: list[str]


class DeviceFolder:
    """A device's folder (see the module docstring).

    Raises:
        InputError: no ``device.json`` or one of another format or version.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.root = Path(folder)
        p = self.root / "device.json"
        try:
            info = json.loads(p.read_text(encoding="utf-8"))
        except OSError as e:
            raise InputError(f"cannot read ({e.strerror})", path=p,
                             expected="a device folder made by `privasr device init`") from None
        except ValueError as e:
            raise InputError(f"not JSON ({e})", path=p) from None
        if not isinstance(info, dict) or info.get("format") != DEVICE_FORMAT:
            raise InputError("not a privasr device description", path=p, expected=f"'format': '{DEVICE_FORMAT}'")
        if info.get("version") != DEVICE_VERSION:
            raise InputError(f"device folder version {info.get('version')!r}", path=p,
                             expected=f"version {DEVICE_VERSION}")
        try:
            self.index = int(info["index"])
            self.name = str(info["name"])
            self.bundle_hash = str(info["bundle"])
            self.trusted_apps = tuple(str(h) for h in info["trusted_apps"])
            box = Path(str(info["inbox"]))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"a device description without a valid {e}", path=p) from None
        self.inbox = box if box.is_absolute() else self.root / box
        self.state = self.root / "state"
        self.ledger_path = self.state / "ledger.json"

    @property
    def bundle(self) -> Path:
        """The bundle's folder."""
        return self.root / "bundle"

    @property
    def node_states(self) -> Path:
        """Where the client's states between rounds live (the SuperNode's state folder)."""
        return self.state / "flower"

    def ledger(self) -> dict[str, Any]:
        """The ledger: ``{"files": {name: {...}}, "rounds": {"r": [names]}}`` (empty when nothing was taken)."""
        if not self.ledger_path.exists():
            return {"files": {}, "rounds": {}}
        try:
            doc = json.loads(self.ledger_path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
                raise ValueError("no 'files' object")
            return doc
        except (OSError, ValueError) as e:
            raise InputError(f"the device's ledger is unreadable ({e})", path=self.ledger_path,
                             expected="the ledger privasr wrote (restore it from a backup)") from None

    def _candidates(self, companions: tuple[str, ...] = ()) -> list[Path]:
        if not self.inbox.is_dir():
            raise InputError("the inbox is not a folder", path=self.inbox, expected="the user's files")
        skip = _SKIP + tuple(companions)
        files = [p for p in self.inbox.rglob("*") if p.is_file() and not any(
            part.startswith(".") for part in p.relative_to(self.inbox).parts) and not p.name.endswith(skip)]
        return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.relative_to(self.inbox).as_posix()))

    def group(self, r: int) -> list[dict[str, Any]]:
        """The prepared utterances of round ``r`` (empty for a round that took nothing)."""
        names = self.ledger()["rounds"].get(str(r))
        if not names:
            return []
        return list(load_tree(self.state / "groups" / f"{r}.npz"))

    def taken_rounds(self) -> list[int]:
        """The rounds that took files (or took nothing new), in order."""
        return sorted(int(r) for r in self.ledger()["rounds"])

    def take(self, r: int, prepare: Callable[[list[Any]], list[dict[str, Any]]],
             read: Callable[[Path], list[Any]] | None = None, companions: tuple[str, ...] = ()) -> Taken:
        """Round ``r``'s files: the files that arrived since the last round, read by ``read`` (default: any N-best
        format, :func:`~privasr.corpus.load.load_nbest`; records with an ``utt_id``) and prepared by ``prepare``
        (records in, one dict per utterance out). Files ending in one of ``companions`` belong to another file
        (FTL's features beside their transcripts) and are not taken alone. A round already taken returns what it
        took (a message delivered again after a restart gets the same group).

        Raises:
            InputError: the inbox is missing, the ledger is unreadable.
        """
        from privasr.corpus.load import load_nbest

        read = load_nbest if read is None else read
        led = self.ledger()
        if str(r) in led["rounds"]:
            return Taken(r, self.group(r), list(led["rounds"][str(r)]), [])
        later = [int(k) for k in led["rounds"] if int(k) > r]
        if later:  # a message of an earlier round than one already taken: nothing new goes into it
            return Taken(r, [], [], [])
        seen_utts = set(led.get("utterances", []))
        used, aside, nbests = [], [], []
        for p in self._candidates(companions):
            name = p.relative_to(self.inbox).as_posix()
            entry = led["files"].get(name)
            st = p.stat()
            changed = entry is not None and (entry.get("size"), entry.get("mtime_ns")) != (st.st_size, st.st_mtime_ns)
            if entry is not None:
                if entry.get("status") == "used" or not changed:
                    if changed and not entry.get("changed_logged"):
                        log.warning("%s changed after it was used in round %s; it is not used again", p,
                                    entry.get("round"))
                        entry["changed_logged"] = True
                    continue
                log.info("%s was set aside and has changed since: taking it again", name)
            try:
                recs = read(p)
                ids = [nb.utt_id for nb in recs]
                dup = next((u for u in ids if u in seen_utts), None)
                if dup is None and len(set(ids)) != len(ids):
                    dup = next(u for u in ids if ids.count(u) > 1)
                if dup is not None:
                    raise InputError(f"utterance id {dup!r} was used before", path=p,
                                     expected="each utterance once on this device")
                prepared = prepare(recs)
            except InputError as e:
                err = e if e.path else e.at(p)
                log.warning("set aside %s: %s", name, err)
                led["files"][name] = {"status": "set-aside", "round": r, "error": str(err),
                                      "size": st.st_size, "mtime_ns": st.st_mtime_ns}
                aside.append(name)
                continue
            seen_utts.update(ids)
            nbests.extend(prepared)
            used.append(name)
            led["files"][name] = {"status": "used", "round": r, "sha256": _sha256(p), "size": st.st_size,
                                  "mtime_ns": st.st_mtime_ns, "utterances": len(recs)}
        if nbests:
            save_tree(self.state / "groups" / f"{r}.npz", nbests)
        led["rounds"][str(r)] = used
        led["utterances"] = sorted(seen_utts)
        _write_json(self.ledger_path, led)
        return Taken(r, nbests, used, aside)


def write_replay(nbests: Sequence[Any], out: str | os.PathLike[str], *, key: str = "client",
                 rounds: int) -> list[tuple[str, Path]]:
    """Cut an N-best set into one *replay* folder per client, as a phone would decode it over a run: client
    ``i`` (clients in :meth:`~privasr.corpus.records.Population.group` order) gets
    ``out/<i>/round-<t>/part-<t>.jsonl`` for each of the ``rounds + 1`` time-ordered groups of
    :func:`~privasr.corpus.partition.time_rounds` (the simulation's groups; an empty group has no file).
    ``privasr device serve --replay out/<i>`` copies round ``t``'s files into the device's inbox just before the
    device takes round ``t``. Returns ``(client name, replay folder)`` per client.

    Raises:
        ConfigError: ``out`` exists and is not empty.
    """
    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.corpus.partition import time_rounds
    from privasr.corpus.records import Population

    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"{root} exists and is not an empty folder", expected="a new folder")
    result = []
    for i, c in enumerate(Population.group(nbests, key=key)):
        folder = root / str(i)
        for t, g in enumerate(time_rounds(c.utterances, rounds)):
            if g:
                p = folder / f"round-{t}" / f"part-{t:03d}.jsonl"
                p.parent.mkdir(parents=True, exist_ok=True)
                write_nbest(p, g)
        folder.mkdir(parents=True, exist_ok=True)
        result.append((c.id, folder))
    return result


def replay_into(replay: str | os.PathLike[str], inbox: Path, r: int) -> list[str]:
    """Copy the files of ``replay/round-<r>/`` into ``inbox`` (those not there yet); their names."""
    import shutil

    src = Path(replay) / f"round-{r}"
    copied = []
    if src.is_dir():
        for p in sorted(src.iterdir()):
            dst = inbox / p.name
            if p.is_file() and not dst.exists():
                tmp = inbox / f".{p.name}.part"
                shutil.copyfile(p, tmp)
                os.replace(tmp, dst)
                copied.append(p.name)
    return copied
