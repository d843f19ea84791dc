"""``privasr bench secagg --quick``: SecAgg+ vs plain aggregation in one process (about 5 s)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from privasr.bench import BENCHMARKS, get  # noqa: E402
from privasr.bench.secagg import QUICK_CASES, STAGES, BenchDelta, BenchFmp  # noqa: E402
from privasr.cli.bench import run as run_cli  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402


def test_toy_updates_have_the_real_formats():
    alg = BenchFmp(1000, words=300)
    u, _ = alg.client_update(alg.broadcast(alg.init(np.random.default_rng(0)), 0), 0, None,
                             np.random.default_rng([0, 1]))
    ids, counts = u.arrays["ids"], u.arrays["counts"]
    assert ids.dtype == np.int64 and ids.size == 300 and np.all(np.diff(ids) > 0) and np.all(counts > 0)
    assert u.weight == pytest.approx(counts.sum())
    acc = alg.accumulate(None, u)  # FMP's own accumulate takes it
    assert acc.arrays["counts"].shape == (1000,)
    delta = BenchDelta(1000)
    d, _ = delta.client_update(delta.broadcast(delta.init(np.random.default_rng(0)), 0), 0, None,
                               np.random.default_rng([0, 1]))
    assert all(a.dtype == np.float32 for a in d.arrays.values())
    assert sum(a.size for a in d.arrays.values()) == 1000 and BenchDelta.norm(d) == pytest.approx(0.5, rel=1e-5)


def test_secagg_benchmark_quick(tmp_path):
    assert BENCHMARKS["secagg"] == "privasr.bench.secagg:run"
    m = get("secagg")(tmp_path, quick=True, seed=0)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["metrics"] == json.loads(json.dumps(m)) and res["config"]["quick"] is True
    assert "| fmp_2k |" in (tmp_path / "report.md").read_text()
    assert m["cpu_count"] >= 1 and m["clients"] == 4 and m["error_within_bound"] is True
    assert set(m["cases"]) == set(QUICK_CASES)
    for name, c in m["cases"].items():
        for key in ("secure_vs_plain_time", "secure_vs_plain_upload", "secure_vs_plain_download",
                    "secure_vs_plain_client_time", "dropout_vs_secure_time", "client_masking_s"):
            assert c[key] > 0, (name, key)
        # the masked vector is one int64 per value: at least twice a float32 delta, and V values for FMP
        # where the plain update has 300 ids and counts
        assert c["secure_upload_bytes"] > 1.9 * c["plain_upload_bytes"], name
        if c["kind"] == "fmp":
            assert c["secure_upload_bytes"] > 8 * c["size"] > c["plain_upload_bytes"], name
        assert c["secure_upload_by_stage"]["collect masked vectors"] >= 8 * c["size"]  # one int64 per value
        assert sum(c["secure_upload_by_stage"].values()) == pytest.approx(c["secure_upload_bytes"])
        # a client's masking is part of its time in the secure round
        assert 0 < c["client_masking_s"] < c["secure_client_s"]
        assert set(c["stage_share"]) == {*STAGES, "decode"}
        assert sum(c["stage_share"].values()) == pytest.approx(1.0, abs=1e-6)
        assert 0 <= c["max_error_steps"] <= c["error_bound_steps"] == 4
        assert 0 <= c["dropout_max_error_steps"] <= 3 and c["dropout_survivors"] == 3
        assert c["max_error_steps"] > 0  # the values did go through the quantiser


def test_clients_option(tmp_path):
    with pytest.raises(ConfigError, match="at least 4"):
        get("secagg")(tmp_path, quick=True, clients=3)
    with pytest.raises(ConfigError, match="--clients with benchmark 'readers'"):
        run_cli("readers", tmp_path, True, 0, clients=5)
