"""N-best lists from HTK SLF lattices, checked against brute-force path enumeration and the real AMI lattices."""

from __future__ import annotations

import gzip
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.corpus.formats.htk_lattice import Lattice, best_path_scores, is_filler, parse_htk_lattice
from privasr.corpus.formats.slf_nbest import lattice_nbest, lattice_utt_id, read_htk_nbest
from privasr.corpus.load import detect_format, load_nbest, load_path
from privasr.errors import InputError

from ._helpers import expect_error

WORDS = ["a", "b", "c", "d", "!NULL", "<sil>", "[NOISE]"]


def random_lattice(rng: random.Random, n_nodes: int, *, lmscale: float, wdpenalty: float) -> str:
    """A random DAG lattice (nodes in topological order, a chain 0..n-1 so the end is reachable), words on nodes."""
    nodes = ["I=0 t=0.00 W=!NULL"]
    for i in range(1, n_nodes):
        nodes.append(f"I={i} t={i / 10:.2f} W={rng.choice(WORDS)}")
    edges = {(i, i + 1) for i in range(n_nodes - 1)}
    for _ in range(2 * n_nodes):
        s, e = sorted(rng.sample(range(n_nodes), 2))
        edges.add((s, e))
    links = []
    for j, (s, e) in enumerate(sorted(edges)):
        lm = f" l={rng.uniform(-5, 0):.4f}" if rng.random() < 0.8 else ""
        links.append(f"J={j} S={s} E={e} a={rng.uniform(-20, 0):.4f}{lm}")
    head = f"VERSION=1.0\nlmscale={lmscale} wdpenalty={wdpenalty}\nstart=0\nend={n_nodes - 1}\n"
    return head + f"N={n_nodes} L={len(links)}\n" + "\n".join(nodes + links) + "\n"


def brute_force(lat: Lattice, lmscale: float, wdpenalty: float) -> dict[tuple[str, ...], tuple[float, float, float]]:
    """Every start-to-end path, its filler-free words and (total, am, lm); the best path per word string."""
    out: dict[int, list[int]] = {}
    for j, s in enumerate(lat.link_start.tolist()):
        out.setdefault(s, []).append(j)
    best: dict[tuple[str, ...], tuple[float, float, float]] = {}

    def walk(u: int, words: tuple[str, ...], am: float, lm: float) -> None:
        if u == lat.end:
            total = am + lmscale * lm + wdpenalty * len(words)
            if words not in best or total > best[words][0]:
                best[words] = (total, am, lm)
        for j in out.get(u, []):
            w = lat.link_word(j)
            g = float(lat.link_lm[j])
            walk(int(lat.link_end[j]), words if is_filler(w) else (*words, w), am + float(lat.link_am[j]),
                 lm + (0.0 if math.isnan(g) else g))

    walk(lat.start, (), 0.0, 0.0)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_top_n_equals_brute_force(seed):
    rng = random.Random(seed)
    lmscale, wdpenalty = rng.choice([1.0, 14.0, 0.5]), rng.choice([0.0, -2.5, 1.0])
    lat = parse_htk_lattice(random_lattice(rng, rng.randint(3, 9), lmscale=lmscale, wdpenalty=wdpenalty))
    oracle = brute_force(lat, lmscale, wdpenalty)
    ranked = sorted(oracle.items(), key=lambda kv: -kv[1][0])
    n = rng.randint(1, 12)
    nb = lattice_nbest(lat, "u", n)
    assert len(nb.hyps) == min(n, len(oracle))
    assert len({h.words for h in nb.hyps}) == len(nb.hyps)  # duplicates merged
    for h, (_, (total, _, _)) in zip(nb.hyps, ranked, strict=False):
        assert h.scores["total"] == pytest.approx(total, abs=1e-9)
        # the k-th hypothesis is one of the strings with the k-th best score, with its best path's scores
        assert oracle[h.words][0] == pytest.approx(total, abs=1e-9)
        assert (h.scores["am"], h.scores["lm"]) == pytest.approx(oracle[h.words][1:], abs=1e-9)
    assert nb.meta["lmscale"] == lmscale and nb.meta["wdpenalty"] == wdpenalty


def test_scale_factors_from_header_and_arguments():
    text = """lmscale=10 start=0 end=3
N=4 L=4
I=0 t=0 W=!NULL
I=1 t=1 W=loud
I=2 t=1 W=quiet
I=3 t=2 W=!NULL
J=0 S=0 E=1 a=-1 l=-3
J=1 S=0 E=2 a=-5 l=-1
J=2 S=1 E=3 a=0
J=3 S=2 E=3 a=0
"""
    lat = parse_htk_lattice(text)
    assert [h.text for h in lattice_nbest(lat, "u").hyps] == ["quiet", "loud"]  # -15 vs -31
    assert [h.text for h in lattice_nbest(lat, "u", lmscale=1.0).hyps] == ["loud", "quiet"]  # -4 vs -6
    no_header = parse_htk_lattice(text.replace("lmscale=10 ", ""))
    assert lattice_nbest(no_header, "u").meta["lmscale"] == 1.0  # HTK's default


def test_filler_only_path_is_the_empty_hypothesis():
    lat = parse_htk_lattice("start=0 end=2\nN=3 L=3\nI=0 W=!NULL\nI=1 W=<sil>\nI=2 W=!NULL\n"
                            "J=0 S=0 E=1 a=-1\nJ=1 S=1 E=2 a=-1\nJ=2 S=0 E=2 a=-3\n")
    nb = lattice_nbest(lat, "u", 5)
    assert [(h.words, h.scores["total"]) for h in nb.hyps] == [((), -2.0)]


def test_bad_inputs(tmp_path):
    bad = tmp_path / "u1.lat"
    bad.write_text("N=2 L=1\nI=0 t=0 W=!NULL\nI=1 t=abc W=x\nJ=0 S=0 E=1\n")
    expect_error(read_htk_nbest, bad, 3, "node time")
    dead = tmp_path / "dead.lat"  # the end node (1) has no link into it
    dead.write_text("start=0 end=1\nN=3 L=1\nI=0 t=0\nI=1 t=1 W=x\nI=2 t=0.5 W=y\nJ=0 S=0 E=2 a=-1\n")
    expect_error(read_htk_nbest, dead, None, "no path from the start node 0 to the end node 1")
    scale = tmp_path / "scale.lat"
    scale.write_text("lmscale=nan start=0 end=1\nN=2 L=1\nI=0 t=0\nI=1 t=1 W=x\nJ=0 S=0 E=1\n")
    expect_error(read_htk_nbest, scale, None, "lmscale")
    cyc = tmp_path / "cyc.lat"
    cyc.write_text("start=0 end=2\nN=3 L=3\nI=0 t=0\nI=1 t=1 W=x\nI=2 t=2\nJ=0 S=0 E=1\nJ=1 S=1 E=0\nJ=2 S=1 E=2\n")
    expect_error(read_htk_nbest, cyc, None, "cycle")
    with pytest.raises(InputError, match="expected an integer >= 1"):
        read_htk_nbest(dead, 0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no lattice files"):
        read_htk_nbest(empty)
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / "a.lat").write_text("N=1 L=0\nI=0 t=0\n")
    with gzip.open(twice / "a.lat.gz", "wt") as f:
        f.write("N=1 L=0\nI=0 t=0\n")
    with pytest.raises(InputError, match="two lattices"):
        read_htk_nbest(twice)


def test_utt_ids():
    assert lattice_utt_id("x/AMI-3E0501_u3005_1_2.lat.gz") == "AMI-3E0501_u3005_1_2"
    assert lattice_utt_id("u.slf") == "u" and lattice_utt_id("u.htk.xz") == "u"


# ------------------------------------------------------------------------------------ the real AMI lattices


@pytest.fixture(scope="module")
def ami(shared_data: Path) -> Path:
    p = shared_data / "ami-htk-lattices"
    if not p.is_dir():
        pytest.skip("ami-htk-lattices not in the shared data")
    return p


def test_ami_lattices_detected_and_loaded(ami):
    sets = load_path(ami)
    assert [(d.name, d.kind, d.fmt, len(d.records)) for d in sets] == [("ami-htk-lattices", "nbest", "htk-lattice", 8)]
    one = sorted(ami.glob("*.lat.gz"))[0]
    assert detect_format(one) == "htk-lattice"
    recs = load_nbest(ami)
    assert [nb.utt_id for nb in recs] == sorted(lattice_utt_id(p) for p in ami.glob("*.lat.gz"))
    for nb in recs:
        assert len(nb.hyps) == 10
        totals = [h.scores["total"] for h in nb.hyps]
        assert totals == sorted(totals, reverse=True)
        assert len({h.words for h in nb.hyps}) == 10
        assert not any(is_filler(w) for h in nb.hyps for w in h.words)
        assert nb.meta["lmscale"] == 14.0 and nb.meta["wdpenalty"] == 0.0 and nb.meta["acscale"] == 1.0
        assert nb.meta["utterance"] == nb.utt_id + ".plp"
        for h in nb.hyps:
            assert h.scores["total"] == pytest.approx(h.scores["am"] + 14.0 * h.scores["lm"])
    first = recs[3]
    assert first.utt_id == "AMI-3E0501_u3005_137775_137928"
    assert first.best.text == "SHORT AMOUNT OF TIME"


def test_ami_acoustic_only_ranking_matches_best_path_scores(ami):
    """With lmscale 0 the total of each string is its best acoustic path: best_path_scores' own answer."""
    from privasr.corpus.formats.htk_lattice import read_htk_lattice

    for f in sorted(ami.glob("*.lat.gz"))[:3]:
        lat = read_htk_lattice(f)
        nb = lattice_nbest(lat, "u", 20, lmscale=0.0)
        oracle = best_path_scores(lat, [h.words for h in nb.hyps])
        assert [h.scores["total"] for h in nb.hyps] == pytest.approx(oracle, abs=1e-6)
        assert nb.hyps[0].scores["total"] == pytest.approx(best_path_scores(lat, [nb.hyps[0].words])[0])


SEED_LATTICE = random_lattice(random.Random(7), 6, lmscale=2.0, wdpenalty=-1.0)
JUNK = ["nan", "inf", "-1e999", "x", "", "=", "W=", "N=", "I=99", "J=0", "S=-1", "E=1e3", '"', "\xff", "t=", "#"]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_fuzzed_lattices_give_records_or_input_error(tmp_path_factory, data):
    lines = SEED_LATTICE.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["drop", "dup", "swap", "token"]))
        i, k = data.draw(st.integers(0, len(lines) - 1)), data.draw(st.integers(0, len(lines) - 1))
        if op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            lines[i], lines[k] = lines[k], lines[i]
        else:
            toks = lines[i].split() or [""]
            toks[data.draw(st.integers(0, len(toks) - 1))] = data.draw(st.sampled_from(JUNK))
            lines[i] = " ".join(toks)
    p = tmp_path_factory.mktemp("fuzz") / "u.lat"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
    try:
        recs = read_htk_nbest(p, 5)
    except InputError as e:
        assert e.path is not None and str(p) in e.path
        return
    assert len(recs) == 1 and len(recs[0].hyps) <= 5
    totals = [h.scores["total"] for h in recs[0].hyps]
    assert totals == sorted(totals, reverse=True)
