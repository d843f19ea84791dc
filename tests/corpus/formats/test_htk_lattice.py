"""Tests of the HTK SLF lattice reader and the best path that spells given words."""

from __future__ import annotations

import gzip
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.corpus.formats.htk_lattice import (
    best_path_scores,
    is_filler,
    parse_htk_lattice,
    read_htk_lattice,
    word_posteriors,
)
from privasr.errors import InputError

# Two competing paths for "a b" (scores -5 and -4.5), one for "a c", silence and null nodes in between.
LAT = """VERSION=1.0
UTTERANCE=u1
start=0
end=6
N=7 L=9
I=0 t=0.00 W=!NULL
I=1 t=0.10 W=a v=1
I=2 t=0.20 W=<sil>
I=3 t=0.30 W=b v=2
I=4 t=0.30 W=c
I=5 t=0.30 W=b
I=6 t=0.40 W=!SENT_END
J=0 S=0 E=1 a=-1.0 l=-0.5
J=1 S=1 E=2 a=-0.5
J=2 S=2 E=3 a=-3.0
J=3 S=1 E=4 a=-2.0
J=4 S=3 E=6 a=-0.5
J=5 S=4 E=6 a=-0.25
J=6 S=1 E=5 a=-3.0
J=7 S=5 E=6 a=-0.5
J=8 S=0 E=6 a=-9.0
"""


def test_parse_fields():
    lat = parse_htk_lattice(LAT, "u1.lat")
    assert (lat.start, lat.end, lat.n_nodes, lat.n_links) == (0, 6, 7, 9)
    assert lat.node_words[3] == "b" and lat.node_times[3] == 0.3
    assert lat.header["UTTERANCE"] == "u1"
    assert lat.link_am.tolist()[:3] == [-1.0, -0.5, -3.0]
    assert lat.link_lm[0] == -0.5 and math.isnan(lat.link_lm[1])


def test_best_path_prefers_the_higher_acoustic_score():
    lat = parse_htk_lattice(LAT)
    # a b: via <sil> -1 -0.5 -3 -0.5 = -5.0, or directly -1 -3 -0.5 = -4.5
    # a c: -1 -2 -0.25 = -3.25; the empty sequence: the direct link, -9
    assert best_path_scores(lat, [("a", "b"), ("a", "c"), (), ("b",), ("a", "b", "c")]) == [-4.5, -3.25, -9.0, None, None]


def test_best_path_matches_exhaustive_search():
    lat = parse_htk_lattice(LAT)
    out: dict[tuple[str, ...], float] = {}

    def walk(node: int, words: tuple[str, ...], score: float) -> None:
        if node == lat.end:
            out[words] = max(out.get(words, -math.inf), score)
            return
        for j in np.flatnonzero(lat.link_start == node):
            w = lat.link_word(int(j))
            walk(int(lat.link_end[j]), words if is_filler(w) else (*words, w), score + float(lat.link_am[j]))

    walk(lat.start, (), 0.0)
    keys = sorted(out)
    assert best_path_scores(lat, keys) == [out[k] for k in keys]


def test_words_on_links_and_quotes_and_base():
    text = '''base=10.0
N=3 L=2
I=0 t=0
I=1 t=1
I=2 t=2
J=0 S=0 E=1 W="it's" a=-1
J=1 S=1 E=2 W=!NULL a=-2
'''
    lat = parse_htk_lattice(text)
    assert lat.link_word(0) == "it's"
    assert best_path_scores(lat, [("it's",)]) == pytest.approx([-3 * math.log(10.0)])


def test_word_key_folds_variants():
    lat = parse_htk_lattice(LAT.replace("W=c", "W=c(2)"))
    assert best_path_scores(lat, [("a", "c")]) == [None]
    assert best_path_scores(lat, [("a", "c")], word_key=lambda w: w.split("(")[0]) == [-3.25]


@pytest.mark.parametrize("text, message", [
    ("N=1 L=0\nI=0 t=abc\n", "2: node time t is 'abc'"),
    ("I=0 t=0\n", "1: a node before the N= L= size line"),
    ("N=2 L=1\nI=0\nI=1\nJ=0 S=0 E=5\n", "4: link 0 refers to node 5"),
    ("N=2 L=1\nI=0\nI=0\n", "3: node 0 defined twice"),
    ("N=2 L=0\nI=0\n", "1 nodes and 0 links, the size line says N=2 L=0"),
    ("N=1 L=0\nI=0 oops\n", "2: cannot parse 'oops'"),
    ("N=1 L=0\nI=0 t=inf\n", "node time t is 'inf'"),
    ("VERSION=1.0\n", "no N= L= size line"),
    ("N=2 L=1\nI=0\nI=1\nJ=0 S=0 E=1 a=x\n", "link 0 a is 'x'"),
])
def test_errors_name_the_line(text, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_htk_lattice(text, "bad.lat")


def test_cycle_is_an_error():
    lat = parse_htk_lattice("start=0\nend=1\nN=2 L=2\nI=0 W=a\nI=1 W=b\nJ=0 S=0 E=1 a=-1\nJ=1 S=1 E=0 a=-1\n")
    with pytest.raises(InputError, match="cycle"):
        best_path_scores(lat, [("b",)])


def test_read_compressed(tmp_path):
    p = tmp_path / "u.lat.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write(LAT)
    assert read_htk_lattice(p).n_links == 9


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_bytes_give_a_lattice_or_input_error(data):
    text = data.decode("utf-8", errors="replace")
    try:
        lat = parse_htk_lattice(text, "fuzz.lat")
    except InputError:
        return
    try:
        scores = best_path_scores(lat, [("a",)])
    except InputError as e:  # a cyclic graph is the only other outcome
        assert "cycle" in str(e)
        return
    assert len(scores) == 1


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(LAT.splitlines()) - 1), st.sampled_from(["", "J=", "x=1 y", "N=3 L=3", "t=nan", "\x00"]))
def test_fuzz_line_damage(k, junk):
    lines = LAT.splitlines()
    lines[k] = lines[k] + " " + junk if junk else ""
    try:
        lat = parse_htk_lattice("\n".join(lines))
    except InputError:
        return
    combos = list(itertools.islice(itertools.product(["a", "b", "c"], repeat=2), 4))
    assert len(best_path_scores(lat, combos)) == 4


@pytest.mark.shared
def test_shared_ami_lattices(shared_data):
    files = sorted((shared_data / "ami-htk-lattices").glob("*.lat.gz"))
    if not files:
        pytest.skip("ami-htk-lattices not present")
    for f in files:
        lat = read_htk_lattice(f)
        assert lat.header["lmscale"] == "14.00"
        assert 834 <= lat.n_nodes <= 4967 and 1410 <= lat.n_links <= 11763  # the sizes SOURCE.txt gives
        assert np.isfinite(lat.link_lm).all()  # every link carries an LM score
        assert lat.node_words[lat.start] == "!NULL" and lat.node_times[lat.end] == max(lat.node_times)


# ------------------------------------------------------------------ link posteriors and word confidences

POST = """N=6 L=7
I=0 t=0.00 W=!NULL
I=1 t=0.00 W=the
I=2 t=0.20 W=cat
I=3 t=0.22 W=cat
I=4 t=0.20 W=cap
I=5 t=0.60 W=!SENT_END
J=0 S=0 E=1 a=-1 p=1.0001
J=1 S=1 E=2 a=-1 p=0.5
J=2 S=1 E=3 a=-1 p=0.2
J=3 S=1 E=4 a=-1 p=0.3
J=4 S=2 E=5 a=-1 p=0.5
J=5 S=3 E=5 a=-1 p=0.2
J=6 S=4 E=5 a=-1 p=0.3
"""


def test_link_posteriors_are_read_and_a_rounded_certainty_is_one():
    lat = parse_htk_lattice(POST)
    assert lat.link_posterior.tolist() == [1.0, 0.5, 0.2, 0.3, 0.5, 0.2, 0.3]
    assert np.isnan(parse_htk_lattice(LAT).link_posterior).all()  # no p= anywhere
    with pytest.raises(InputError, match=r"u.lat:8: link 0 posterior p=1.5"):
        parse_htk_lattice(POST.replace("p=1.0001", "p=1.5"), "u.lat")
    with pytest.raises(InputError, match="posterior p"):
        parse_htk_lattice(POST.replace("p=0.5\nJ=2", "p=-0.1\nJ=2"))


def test_word_posteriors_sum_the_copies_of_a_word_through_a_frame():
    # pocketsphinx's convention: a node is a word at its start time, its out-links are its end times
    lat = parse_htk_lattice(POST)
    segs = [("the", 0.0, 0.19), ("cat", 0.2, 0.59), ("cap", 0.2, 0.59), ("dog", 0.2, 0.59)]
    # 'cat' starts at 0.20 (p 0.5) and at 0.22 (p 0.2): both cover frames 22..59, so C_max is 0.7
    assert [round(p, 6) for p in word_posteriors(lat, segs, word_on="start")] == [1.0, 0.7, 0.3, 0.0]
    # a segment only partly covered takes its best frame; outside every link it is 0
    assert word_posteriors(lat, [("cat", 0.2, 0.21)], word_on="start") == [0.5]
    assert word_posteriors(lat, [("cat", 0.6, 0.7)], word_on="start") == [0.0]
    # the HTK convention puts each link's word on its end node: 'the' then spans nothing (0.00 -> 0.00)
    assert word_posteriors(lat, [("cat", 0.0, 0.19)], word_on="end") == [0.5 + 0.2]
    assert word_posteriors(lat, [("the", 0.0, 0.0)], word_on="end") == [0.0]


def test_word_posteriors_bad_input():
    lat = parse_htk_lattice(POST)
    with pytest.raises(InputError, match="word_on"):
        word_posteriors(lat, [], word_on="middle")
    with pytest.raises(InputError, match="frame_s"):
        word_posteriors(lat, [], frame_s=0.0)
    with pytest.raises(InputError, match="ends"):
        word_posteriors(lat, [("cat", 0.5, 0.2)])
    with pytest.raises(InputError, match="without a posterior"):
        word_posteriors(parse_htk_lattice(LAT), [("a", 0.0, 0.1)])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6))
def test_word_posteriors_stay_probabilities(ps):
    # a fan of competing links between the same two times: their posteriors need not sum to one in a
    # damaged lattice, but the confidence is always clipped into [0, 1]
    lines = ["N=8 L=12", "I=0 t=0.00 W=!NULL", "I=7 t=0.50 W=!SENT_END"]
    lines += [f"I={i} t=0.10 W={'ab'[i % 2]}" for i in range(1, 7)]
    lines += [f"J={i - 1} S=0 E={i} a=-1 p={p}" for i, p in enumerate(ps, 1)]
    lines += [f"J={i + 5} S={i} E=7 a=-1 p={p}" for i, p in enumerate(ps, 1)]
    out = word_posteriors(parse_htk_lattice("\n".join(lines)), [("a", 0.1, 0.4), ("b", 0.1, 0.4)], word_on="start")
    assert all(0.0 <= p <= 1.0 for p in out)
    assert out[0] == pytest.approx(min(1.0, sum(ps[1::2]))) and out[1] == pytest.approx(min(1.0, sum(ps[0::2])))
