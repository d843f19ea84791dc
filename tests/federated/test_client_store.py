"""One client per folder without pickle: exact round trips of every client type, refusals, tampered folders."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import stat
import sys

import numpy as np
import pytest

from privasr.errors import InputError
from privasr.federated.algorithms import FmpClient, FmpUtterance
from privasr.federated.client_store import (
    DATA_NAME,
    MANIFEST_NAME,
    load_client,
    save_client,
    split_clients,
)
from privasr.federated.tree import flatten, save_tree


def _same(a, b, where="client"):
    """Exactly the same value: types, dataclass fields, array dtypes, shapes and values (NaN equal to NaN)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# -- clients built as the algorithms' own tests build them --------------------------------------------------------


def _utt(uid, hyps, base, bw=1.0):  # tests/federated/algorithms/test_fmp.py
    return FmpUtterance(uid, tuple(np.asarray(h, dtype=np.int64) for h in hyps), np.asarray(base, float), bw)


def _fmp_clients(n_clients=3, n_groups=3, per_group=3, v=40, n_hyps=5, seed=1):
    rng = np.random.default_rng(seed)
    clients = []
    for c in range(n_clients):
        groups = []
        for g in range(n_groups):
            utts = []
            for k in range(per_group):
                hyps = [rng.integers(0, v, size=int(rng.integers(0, 7))) for _ in range(n_hyps)]
                utts.append(_utt(f"c{c}g{g}u{k}", hyps, np.sort(rng.normal(size=n_hyps))[::-1], 0.7))
            groups.append(tuple(utts))
        clients.append(FmpClient(f"client{c}", tuple(groups)))
    clients.append(FmpClient("sparse", ((_utt("a", [[], [0, 0]], [0.0, -1.0]),), ())))  # empty hyp, empty group
    return clients


def _fedlm_clients():  # tests/federated/algorithms/test_fedlm.py
    from privasr.federated.algorithms.fedlm import FedLmClient

    return [FedLmClient("u1", ((3, 4, 5), (5, 4)), (np.array([1.0, 0.8, 0.9]), np.array([0.7, 1.0]))),
            FedLmClient("u2", ((6, 7, 6, 7),)),
            FedLmClient("z", ((3, 4), (5,)), (np.zeros(2), np.zeros(1)))]


def _ftl_clients():  # tests/federated/algorithms/test_ftl.py
    from privasr.asr.train import Example
    from privasr.asr.units import CharTokenizer
    from privasr.federated.algorithms.ftl import FtlClient

    words = [("AB",), ("BA",), ("AB", "BA")]
    tok = CharTokenizer.train(words)
    out = []
    for c in range(2):
        rng = np.random.default_rng(c)
        ex = tuple(Example(f"c{c}-u{i}", f"s{c}", w, rng.normal(size=(6, 4)).astype(np.float32), tuple(tok.encode(w)))
                   for i, w in enumerate(words))
        out.append(FtlClient(f"c{c}", ex))
    return out


def _toy_clients():  # the toy algorithms of tests/federated/backends/test_flower*.py
    rng = np.random.default_rng(1)
    out: list = [{"x": rng.normal(loc=i, size=(i + 2, 3))} for i in range(3)]
    out[1]["flaky"] = "raise"
    out.append({"nested": [1, 2.5, None, True, "s", (np.float32(1.5), {3: np.zeros((0, 2), dtype=np.int16)})],
                "special": [float("inf"), float("-inf"), float("nan"), -0.0, 2**70],
                "arrays": (np.array([1 + 2j]), np.array([[True, False]]), np.arange(4, dtype=">i4"),
                           np.float64(np.nan), np.int8(-3), np.bool_(True)),
                "privasr.dict": {"privasr.scalar": 1}})  # keys that look like the format's tags
    out.extend([7, np.arange(5.0), ["a", ("b",)], None])
    return out


KINDS = {"fmp": _fmp_clients, "fedlm": _fedlm_clients, "ftl": _ftl_clients, "pytree": _toy_clients}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_client_type_round_trips_exactly(tmp_path, kind):
    if kind in ("fedlm", "ftl"):
        pytest.importorskip("torch")
    clients = KINDS[kind]()
    folders = split_clients(clients, tmp_path / "out")
    assert folders == [tmp_path / "out" / f"client-{i}" for i in range(len(clients))]
    for i, (client, folder) in enumerate(zip(clients, folders, strict=True)):
        assert sorted(p.name for p in folder.iterdir()) == [DATA_NAME, MANIFEST_NAME]
        back = load_client(folder, index=i)
        _same(client, back)
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
        assert manifest["index"] == i
        assert manifest["kind"] == (type(client).__name__ if dataclasses.is_dataclass(client) else "pytree")
        assert manifest["sha256"] == hashlib.sha256((folder / DATA_NAME).read_bytes()).hexdigest()
        assert manifest["privasr"] == sys.modules["privasr"].__version__


def test_rebuilt_fmp_clients_behave_the_same(tmp_path):
    """The derived fields are recomputed by the class itself: the loaded client answers as the original."""
    client = _fmp_clients()[0]
    back = load_client(save_client(tmp_path / "c", client, 0))
    for t in range(len(client.groups) + 1):
        assert np.array_equal(client.vocab_from(t), back.vocab_from(t))
    assert back.groups[1][2].vocab.tolist() == client.groups[1][2].vocab.tolist()
    assert not back.groups[0][0].word_ids[0].flags.writeable  # the class's own invariants hold again


def test_thousands_of_hypotheses_are_a_few_archive_members(tmp_path):
    import zipfile

    client = _fmp_clients(n_clients=1, n_groups=10, per_group=50, n_hyps=10)[0]  # 5,000 hypotheses
    folder = save_client(tmp_path / "c", client, 0)
    with zipfile.ZipFile(folder / DATA_NAME) as z:
        assert len(z.namelist()) < 10  # pooled by dtype, not one member per array
    _same(client, load_client(folder))


@pytest.mark.parametrize(("client", "match"), [
    ({"s": {1, 2}}, r"client 1\['s'\] is a builtins.set"),
    ({"a": np.array(["x"])}, r"client 1\['a'\] is an array of dtype <U1"),
    ([np.array([object()], dtype=object)], r"client 0\[0\] is an array of dtype object"),
    ({(1, 2): 3}, "key of type tuple"),
    (dataclasses.make_dataclass("Mine", [("x", int)])(1), "Mine, which privasr cannot store without pickle"),
])
def test_what_cannot_be_stored_without_pickle_is_refused_and_nothing_is_left(tmp_path, client, match):
    with pytest.raises(InputError, match=match):
        split_clients([{"ok": 1}, client] if not isinstance(client, list) else [client], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError):
        split_clients([{"ok": 1}, client], tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []


def test_existing_data_is_never_overwritten_and_folders_are_private(tmp_path):
    out = tmp_path / "out"
    split_clients([{"x": 1}], out)
    before = (out / "client-0" / DATA_NAME).read_bytes()
    with pytest.raises(InputError, match="exists and is not empty"):
        split_clients([{"x": 2}], out)
    with pytest.raises(InputError, match="exists and is not empty"):
        save_client(out / "client-0", {"x": 2}, 0)
    assert (out / "client-0" / DATA_NAME).read_bytes() == before
    assert stat.S_IMODE((out / "client-0").stat().st_mode) == 0o700
    (tmp_path / "empty").mkdir()
    assert split_clients([{"x": 1}], tmp_path / "empty") == [tmp_path / "empty" / "client-0"]
    with pytest.raises(InputError, match="client index"):
        save_client(tmp_path / "neg", {"x": 1}, -1)


# -- damaged and tampered folders ---------------------------------------------------------------------------------


def _rewrite(folder, doc, *, fix_manifest=True):
    """Replace the data file with ``doc`` (as save_tree writes it) and, like a careful attacker, the manifest's
    fingerprint too."""
    save_tree(folder / DATA_NAME, doc)
    if fix_manifest:
        m = json.loads((folder / MANIFEST_NAME).read_text())
        m["sha256"] = hashlib.sha256((folder / DATA_NAME).read_bytes()).hexdigest()
        (folder / MANIFEST_NAME).write_text(json.dumps(m))


def _doc(tree, pools=(), pool=(), offset=(), ndim=(), dims=(), *, raw=False):
    """A data file's content: the skeleton of ``tree`` (or ``tree`` itself as the skeleton, ``raw``)."""
    skeleton = tree if raw else flatten(tree)[0]

    def ints(v):
        return np.asarray(v, dtype=np.int64).reshape(-1)

    return {"skeleton": json.dumps(skeleton), "pools": list(pools), "pool": ints(pool), "offset": ints(offset),
            "ndim": ints(ndim), "dims": ints(dims)}


def test_a_changed_or_damaged_folder_names_the_file(tmp_path):
    folder = save_client(tmp_path / "c", _fmp_clients()[0], 2)
    data, manifest = folder / DATA_NAME, folder / MANIFEST_NAME
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"client\.npz: the data file does not match the SHA-256") as e:
        load_client(folder)
    assert e.value.path == str(data)
    with pytest.raises(InputError, match=r"manifest\.json: the folder holds client 2 \(expected client 3\)"):
        load_client(folder, index=3)
    manifest.write_text("{not json")
    with pytest.raises(InputError, match=r"manifest\.json: unreadable manifest"):
        load_client(folder)
    manifest.write_text(json.dumps({"format": "privasr-client-1", "kind": "pytree"}))
    with pytest.raises(InputError, match=r"manifest\.json: the manifest lacks"):
        load_client(folder)
    manifest.unlink()
    with pytest.raises(InputError, match=r"manifest\.json: no manifest"):
        load_client(folder)
    with pytest.raises(InputError, match="no such client folder"):
        load_client(tmp_path / "nowhere")
    other = save_client(tmp_path / "d", {"x": 1}, 0)
    (other / DATA_NAME).unlink()
    with pytest.raises(InputError, match=r"client\.npz: the client's data file is missing"):
        load_client(other)


@pytest.mark.parametrize(("doc", "match"), [
    (_doc({"privasr.dataclass": ["this", {}]}), "names the class 'this', which a client folder may not"),
    (_doc({"privasr.dataclass": ["os.system", {"command": "true"}]}), "names the class 'os.system'"),
    (_doc({"privasr.dataclass": ["FmpClient", {"id": "c"}]}), r"a FmpClient has the fields \['id'\]"),
    (_doc({"privasr.dataclass": ["FmpClient", {"id": "", "groups": ()}]}), "a FmpClient is invalid"),
    (_doc({"privasr.scalar": "x"}), "a scalar is not a 0-d array"),
    (_doc({"__array__": 0}, pools=[np.zeros(2)], pool=[0], offset=[1], ndim=[1], dims=[5], raw=True),
     "outside its pool"),
    (_doc({"__array__": 0}, pools=[np.zeros(2)], pool=[0], offset=[0], ndim=[2], dims=[2], raw=True),
     "inconsistent"),
    (_doc({"__array__": 3}, raw=True), "IndexError"),
    (_doc({"__set__": []}, raw=True), "ValueError"),
    ({"skeleton": 3}, "no skeleton"),
])
def test_a_tampered_data_file_is_refused_without_importing_anything(tmp_path, doc, match):
    folder = save_client(tmp_path / "c", {"x": 1}, 0)
    _rewrite(folder, doc)
    before = set(sys.modules)
    with pytest.raises(InputError, match=match) as e:
        load_client(folder)
    assert e.value.path == str(folder / DATA_NAME)
    assert "this" not in sys.modules  # a module a file names is never imported
    assert not {m for m in set(sys.modules) - before if not m.startswith("privasr.federated.algorithms")}


def test_a_manifest_that_names_another_kind_is_refused(tmp_path):
    folder = save_client(tmp_path / "c", _fmp_clients()[0], 0)
    m = json.loads((folder / MANIFEST_NAME).read_text())
    m["kind"] = "pytree"
    (folder / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(InputError, match="holds a FmpClient, the manifest says pytree"):
        load_client(folder)
