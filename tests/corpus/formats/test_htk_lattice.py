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
