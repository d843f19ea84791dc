"""Checkpoints: identical logits after a round trip; clear errors for broken or mismatched files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from privasr.errors import InputError  # noqa: E402
from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from privasr.lm.neural.models import NeuralLMConfig, build_model  # noqa: E402
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402

VOCAB = Vocabulary.build([s.split() for s in ["the cat sat", "a dog ran", "the dog sat on a mat"]])


def _saved(tmp_path: Path, preset: str, **changes) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(3)
    cfg = NeuralLMConfig.preset(preset).replace(**changes)
    m = build_model(cfg, VOCAB)
    p = tmp_path / f"{preset}.pt"
    save_checkpoint(p, m, VOCAB, m.config, extra={"epoch": 2, "ppl": 12.5})
    return p, m


@pytest.mark.parametrize("preset,changes", [("tiny-transformer", {}), ("tiny-transformer", {"positions": "learned",
                                            "tie_embeddings": True}), ("tiny-lstm", {}), ("tiny-lstm-char", {})])
def test_round_trip_gives_identical_logits(tmp_path: Path, preset: str, changes: dict) -> None:
    p, m = _saved(tmp_path, preset, **changes)
    ck = load_checkpoint(p)
    assert ck.vocab == VOCAB and ck.config == m.config and ck.extra == {"epoch": 2, "ppl": 12.5}
    assert not ck.model.training and ck.train_state is None
    ids = torch.tensor([[1, 3, 4, 5, 6], [1, 7, 8, 2, 0]])
    m.eval()
    assert torch.equal(m(ids)[0], ck.model(ids)[0])
    if changes.get("tie_embeddings"):
        assert ck.model.output.weight is ck.model.embed.weight


def test_train_state_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = build_model(NeuralLMConfig.preset("tiny-lstm"), VOCAB)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    m(torch.tensor([[1, 3]]))[0].sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "epoch": 3, "history": [{"a": 1.5}]}
    save_checkpoint(tmp_path / "last.pt", m, VOCAB, m.config, extra={}, train_state=state)
    ck = load_checkpoint(tmp_path / "last.pt")
    assert ck.train_state["epoch"] == 3 and torch.equal(ck.train_state["rng"], state["rng"])
    opt2 = torch.optim.Adam(ck.model.parameters(), lr=0.01)
    opt2.load_state_dict(ck.train_state["optimizer"])
    assert opt2.state_dict()["state"][0]["step"] == 1


def _expect_error(path: Path, *fragments: str) -> None:
    with pytest.raises(InputError) as ei:
        load_checkpoint(path)
    msg = str(ei.value)
    assert str(path) in msg
    for f in fragments:
        assert f in msg, msg


def test_missing_truncated_corrupt_and_foreign_files(tmp_path: Path) -> None:
    p, _ = _saved(tmp_path, "tiny-lstm")
    _expect_error(tmp_path / "nope.pt", "no such file")
    data = p.read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    _expect_error(tmp_path / "trunc.pt", "truncated, corrupt")
    (tmp_path / "junk.pt").write_bytes(b"\x00garbage" * 50)
    _expect_error(tmp_path / "junk.pt", "cannot read")
    (tmp_path / "empty.pt").write_bytes(b"")
    _expect_error(tmp_path / "empty.pt", "cannot read")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    _expect_error(tmp_path / "foreign.pt", "not a privasr neural LM checkpoint")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    _expect_error(tmp_path / "tensor.pt", "not a privasr")
    # a pickled object that weights_only refuses (would run code): reported, not executed
    torch.save({"format": "privasr-nnlm", "obj": Path("x")}, tmp_path / "pickled.pt")
    _expect_error(tmp_path / "pickled.pt", "cannot read")
    _expect_error(tmp_path, "not a regular file")


def _rewrite(src: Path, dst: Path, edit) -> Path:
    obj = torch.load(src, weights_only=True)
    edit(obj)
    torch.save(obj, dst)
    return dst


def test_mismatches_are_input_errors(tmp_path: Path) -> None:
    p, _ = _saved(tmp_path, "tiny-lstm")

    def other_vocab(o):
        meta = json.loads(o["meta"])
        meta["vocab"]["words"].append("extra")
        meta["vocab"]["counts"].append(1)  # a consistent vocabulary, of another size than the weights
        meta["config"]["vocab_size"] += 1
        o["meta"] = json.dumps(meta)

    _expect_error(_rewrite(p, tmp_path / "v.pt", other_vocab), "vocabulary mismatch", "embed.weight")

    def vocab_only(o):
        meta = json.loads(o["meta"])
        meta["vocab"]["words"].append("extra")
        meta["vocab"]["counts"].append(1)  # a consistent vocabulary, of another size than the weights
        o["meta"] = json.dumps(meta)

    _expect_error(_rewrite(p, tmp_path / "v2.pt", vocab_only), "vocabulary mismatch")

    def arch(o):
        meta = json.loads(o["meta"])
        meta["config"]["layers"] = 3
        o["meta"] = json.dumps(meta)

    _expect_error(_rewrite(p, tmp_path / "a.pt", arch), "missing tensors")
    _expect_error(_rewrite(p, tmp_path / "x.pt", lambda o: o["state"].update(bogus=torch.zeros(1))),
                  "unexpected tensors ['bogus']")
    _expect_error(_rewrite(p, tmp_path / "m.pt", lambda o: o.update(meta="{not json")), "bad metadata")
    _expect_error(_rewrite(p, tmp_path / "c.pt", lambda o: o.update(meta=json.dumps(
        {"config": {"arch": "gru"}, "vocab": json.loads(VOCAB.to_json())}))), "bad metadata", "arch")
    _expect_error(_rewrite(p, tmp_path / "ver.pt", lambda o: o.update(version=99)), "version 99")
    _expect_error(_rewrite(p, tmp_path / "s.pt", lambda o: o.update(state={"a": 1})), "'state'")


def test_loading_leaves_the_global_rng_alone(tmp_path: Path) -> None:
    p, _ = _saved(tmp_path, "tiny-lstm-char")
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    load_checkpoint(p)
    assert torch.equal(torch.rand(3), expected)
