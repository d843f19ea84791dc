"""SRILM classes-format I/O, class maps and frequency-binned classes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.errors import InputError
from privasr.lm.ngram.classes import ClassMap, frequency_bin_classes, read_classes, write_classes


def _write(tmp_path, text: str):
    p = tmp_path / "x.classes"
    p.write_text(text, encoding="utf-8")
    return p


def test_read_with_and_without_probabilities(tmp_path) -> None:
    p = _write(tmp_path, "<PER> 0.5 alice\n\n<PER>  0.5\tbob\n<LOC> paris\n<NUM> 5\n<NUM> 1e-1 six\n")
    cm = read_classes(p)
    assert cm.classes == ("<PER>", "<LOC>", "<NUM>")
    assert cm.members("<NUM>") == ("5", "six")  # "5" alone is a word, not a probability
    assert cm.expansions["<NUM>"] == (("5", None), ("six", 0.1))
    assert cm.file_probs("<PER>") == {"alice": 0.5, "bob": 0.5}
    assert cm.file_probs("<NUM>") is None
    assert cm.class_of("paris") == "<LOC>" and cm.class_of("rome") is None
    assert cm.map_words(["bob", "in", "paris"]) == ("<PER>", "in", "<LOC>")
    assert len(cm) == 5 and "six" in cm and "<PER>" not in cm and cm.is_class("<PER>")


@pytest.mark.parametrize(("text", "line", "what"), [
    ("<A> 0.5 new york\n", 1, "multi-word"),
    ("<A> a\n<A> 0.3 b c\n", 2, "multi-word"),
    ("<A> a\n<B> a\n", 2, "already listed"),
    ("<A> a\n<A> a\n", 2, "already listed"),
    ("<A> 1.5 a\n", 1, "out of range"),
    ("<A> -0.1 a\n", 1, "out of range"),
    ("<A> nan a\n", 1, "out of range"),
    ("<A>\n", 1, "no expansion"),
    ("<A> 0.5\n", 1, None),  # "0.5" is the single word of the expansion: allowed
    ("<s> a\n", 1, "reserved"),
    ("<A> </s>\n", 1, "reserved"),
])
def test_bad_lines_name_file_and_line(tmp_path, text: str, line: int, what: str | None) -> None:
    p = _write(tmp_path, text)
    if what is None:
        assert read_classes(p).members("<A>") == ("0.5",)
        return
    with pytest.raises(InputError) as e:
        read_classes(p)
    assert e.value.path == str(p) and e.value.line == line
    assert what in str(e.value)


def test_class_name_that_is_also_a_member(tmp_path) -> None:
    with pytest.raises(InputError, match="both a class name and a class member"):
        read_classes(_write(tmp_path, "<A> b\nb c\n"))


def test_missing_file() -> None:
    with pytest.raises(InputError, match="no such file"):
        read_classes("/nonexistent/x.classes")


def test_write_and_read_back(tmp_path) -> None:
    cm = ClassMap({"<A>": (("x", 0.25), ("y", None)), "<B>": (("z", None),)})
    p = tmp_path / "out.classes.gz"
    write_classes(cm, p)
    assert read_classes(p) == cm
    write_classes(cm, p, {"<A>": {"x": 1 / 3, "y": 2 / 3}})
    back = read_classes(p)
    assert back.file_probs("<A>") == {"x": 1 / 3, "y": 2 / 3}  # exact round trip
    assert back.file_probs("<B>") is None


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), st.integers(1, 1000), min_size=1, max_size=60),
       st.integers(1, 20))
def test_frequency_bins(counts: dict[str, int], n: int) -> None:
    cm = frequency_bin_classes(counts, n)
    assert len(cm.classes) == min(n, len(counts))
    assert sorted(cm.word_classes) == sorted(counts)
    # bins follow the frequency order: every word of bin i is at least as frequent as every word of bin i+1
    mins = [min(counts[w] for w in cm.members(c)) for c in cm.classes]
    maxs = [max(counts[w] for w in cm.members(c)) for c in cm.classes]
    assert all(lo >= hi for lo, hi in zip(mins, maxs[1:], strict=False))


def test_frequency_bins_balance_mass() -> None:
    counts = {f"w{i}": 1000 // (i + 1) for i in range(500)}
    cm = frequency_bin_classes(counts, 10)
    mass = [sum(counts[w] for w in cm.members(c)) for c in cm.classes]
    total = sum(counts.values())
    assert cm.members("<C0>") == ("w0",)
    assert max(mass[2:]) < 0.2 * total and min(mass) > 0.02 * total
    assert frequency_bin_classes({"a": 1, "<s>": 5, "b": 0}, 3).classes == ("<C0>",)
    with pytest.raises(InputError):
        frequency_bin_classes(counts, 0)
    with pytest.raises(InputError):
        frequency_bin_classes({"<C0>": 3, "a": 1}, 2)


_VALID_CLASSES = b"<PER> 0.5 alice\n<PER> 0.5 bob\n<LOC> paris\n<LOC> 1 rome\n"


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.binary(max_size=300),
    st.lists(st.tuples(st.integers(0, len(_VALID_CLASSES) - 1), st.integers(0, 255)), max_size=8).map(
        lambda flips: bytes(b if k not in dict(flips) else dict(flips)[k] for k, b in enumerate(_VALID_CLASSES))),
    st.integers(0, len(_VALID_CLASSES)).map(lambda n: _VALID_CLASSES[:n]),
    st.lists(st.sampled_from(_VALID_CLASSES.splitlines(keepends=True)
                             + [b"<X> -1 a\n", b"<X> nan b\n", b"<X> 2 c\n", b"<X>\n", b"<s> a\n", b"<X> a b c\n",
                                b"<X> 1e999 d\n", b"\xff\xfe\n", b"\n"]), max_size=12).map(b"".join),
))
def test_fuzz_read_classes(tmp_path_factory, data: bytes) -> None:
    """Random and mutated classes files give a class map or InputError, never another exception."""
    p = tmp_path_factory.mktemp("fz") / "f.classes"
    p.write_bytes(data)
    try:
        read_classes(p)
    except InputError as e:
        assert str(p) in str(e)
