"""Neural LM architectures: shapes, causal and tree attention, LSTM state, character-aware embeddings."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from privasr.errors import ConfigError  # noqa: E402
from privasr.lm.neural.models import PRESETS, LstmLM, NeuralLMConfig, TransformerLM, build_model  # noqa: E402
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402

VOCAB = Vocabulary.build([s.split() for s in ["the cat sat on the mat", "a dog ran", "the dog sat",
                                              "cats and dogs", "on a mat"]])


def _model(preset: str, **changes):
    torch.manual_seed(0)
    cfg = NeuralLMConfig.preset(preset)
    if changes:
        cfg = cfg.replace(**changes)
    return build_model(cfg, VOCAB).eval()


def _ids(b: int, t: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(VOCAB), (b, t), generator=g)
    ids[:, 0] = VOCAB.bos_id
    return ids


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm", "tiny-lstm-char"])
def test_shapes_and_types(preset: str) -> None:
    m = _model(preset)
    logits, state = m(_ids(3, 7))
    assert logits.shape == (3, 7, len(VOCAB)) and logits.dtype == torch.float32
    assert isinstance(m, TransformerLM if "transformer" in preset else LstmLM)
    assert m.config.vocab_size == len(VOCAB)
    if isinstance(m, LstmLM):
        h, c = state
        assert h.shape == c.shape == (2, 3, m.config.hidden_dim)
    else:
        assert state is None


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm", "tiny-lstm-char"])
def test_causal_future_tokens_do_not_change_earlier_logits(preset: str) -> None:
    m = _model(preset)
    ids = _ids(2, 8)
    changed = ids.clone()
    changed[:, 5:] = (changed[:, 5:] + 1 - 3) % (len(VOCAB) - 3) + 3
    a, _ = m(ids)
    b, _ = m(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_tree_attention_reproduces_per_sequence_logits(positions: str) -> None:
    m = _model("tiny-transformer", positions=positions)
    w = VOCAB.index
    seqs = [[1, w("the"), w("cat"), w("sat")], [1, w("the"), w("dog")], [1, w("a"), w("dog"), w("ran")]]
    # prefix tree: node = (token, parent); sequences share "<s> the"
    nodes = [(1, -1), (w("the"), 0), (w("cat"), 1), (w("sat"), 2), (w("dog"), 1), (w("a"), 0), (w("dog"), 5),
             (w("ran"), 6)]
    paths = [[0, 1, 2, 3], [0, 1, 4], [0, 5, 6, 7]]
    n = len(nodes)
    mask = torch.zeros(1, n, n, dtype=torch.bool)
    depth = []
    for i in range(n):
        j = i
        while j != -1:
            mask[0, i, j] = True
            j = nodes[j][1]
        depth.append(int(mask[0, i].sum()) - 1)
    ids = torch.tensor([[t for t, _ in nodes]])
    tree_logits, _ = m(ids, positions=torch.tensor([depth]), attn_mask=mask)
    for seq, path in zip(seqs, paths, strict=True):
        alone, _ = m(torch.tensor([seq]))
        torch.testing.assert_close(tree_logits[0, path], alone[0], rtol=1e-5, atol=1e-5)


def test_explicit_causal_mask_equals_default() -> None:
    m = _model("tiny-transformer")
    ids = _ids(2, 6)
    mask = torch.tril(torch.ones(6, 6, dtype=torch.bool)).expand(2, 6, 6)
    torch.testing.assert_close(m(ids)[0], m(ids, attn_mask=mask)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        m(ids, attn_mask=mask.float())
    with pytest.raises(ValueError):
        m(ids, state=(1, 2))


@pytest.mark.parametrize("preset", ["tiny-lstm", "tiny-lstm-char"])
def test_lstm_state_carry_over_equals_full_forward(preset: str) -> None:
    m = _model(preset)
    ids = _ids(3, 9)
    full, (h, c) = m(ids)
    first, st = m(ids[:, :4])
    second, st2 = m(ids[:, 4:], state=st)
    torch.testing.assert_close(torch.cat([first, second], 1), full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st2[0], h)
    steps = [m(ids[:, i:i + 1], state=s)[0] for i, s in _step_states(m, ids)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        m(ids, positions=torch.zeros_like(ids))


def _step_states(m, ids):
    state = None
    for i in range(ids.shape[1]):
        yield i, state
        _, state = m(ids[:, i:i + 1], state=state)


def test_char_aware_embeddings_for_vocab_and_oov_words() -> None:
    m = _model("tiny-lstm-char")
    emb = m.embed
    table_words = list(VOCAB.words)
    by_id = emb(torch.arange(len(VOCAB))[None])[0]
    by_spelling = emb.embed_words(table_words)
    torch.testing.assert_close(by_id, by_spelling)
    # OOV words get vectors from their spelling: distinct from <unk> and from each other, close to their stem
    oov = emb.embed_words(["catz", "dogz", "mats", "qqqq"])
    assert not any(torch.allclose(v, by_id[VOCAB.unk_id]) for v in oov)
    assert torch.linalg.matrix_rank(oov) >= 3
    # spelling is all that matters: the char table rows spell each word with <bow> ... <eow>
    row = emb.char_table[VOCAB.index("cat")]
    spelled = [emb.chars[i] for i in row.tolist() if i != 0]
    assert spelled == ["<bow>", "c", "a", "t", "<eow>"]
    # unknown characters are <unkc>; an over-long word is truncated to the table width
    long = emb._spell(["x" * 100])
    assert long.shape[1] == emb.max_chars and emb.chars[long[0, 1]] == "<unkc>"
    # gradients reach the character CNN
    m.train()
    m(_ids(2, 5))[0].sum().backward()
    assert emb.convs[0].weight.grad is not None and emb.convs[0].weight.grad.abs().sum() > 0


def test_tied_embeddings_share_the_matrix() -> None:
    for preset in ("tiny-transformer", "tiny-lstm"):
        cfg = {"tiny-lstm": {"tie_embeddings": True, "embed_dim": 24}}.get(preset, {"tie_embeddings": True})
        m = _model(preset, **cfg)
        assert m.output.weight is m.embed.weight
        assert m.output_layers() == [m.output]


def test_config_validation_and_presets() -> None:
    for name in PRESETS:
        cfg = NeuralLMConfig.preset(name)
        assert NeuralLMConfig.from_dict(cfg.to_dict()) == cfg
    p0 = NeuralLMConfig.preset("paper000-transformer")
    assert (p0.embed_dim, p0.ffn_dim, p0.layers, p0.heads, p0.dropout) == (256, 1024, 3, 4, 0.1)
    p1 = NeuralLMConfig.preset("paper001-lstm")
    assert (p1.arch, p1.hidden_dim, p1.layers, p1.char_aware, p1.char_embed_dim) == ("lstm", 512, 2, True, 100)
    bad = [{"arch": "gru"}, {"dropout": 1.0}, {"layers": 0}, {"embed_dim": 30, "heads": 4}, {"bogus": 1},
           {"arch": "lstm", "char_aware": True, "tie_embeddings": True}, {"layers": 2.5}, {"char_aware": True},
           {"arch": "lstm", "tie_embeddings": True, "embed_dim": 10, "hidden_dim": 20}, {"positions": "rope"},
           {"char_filters": [[0, 3]]}, {"vocab_size": 2}]
    for b in bad:
        with pytest.raises(ConfigError):
            NeuralLMConfig.from_dict(b)
    with pytest.raises(ConfigError):
        NeuralLMConfig.preset("nope")
    with pytest.raises(ConfigError):
        build_model(NeuralLMConfig.preset("tiny-lstm").replace(vocab_size=len(VOCAB) + 1), VOCAB)


def test_paper_presets_build_with_expected_sizes() -> None:
    big = Vocabulary(("<unk>", "<s>", "</s>") + tuple(f"w{i}" for i in range(997)))
    m = build_model(NeuralLMConfig.preset("paper001-lstm"), big)
    assert m.lstm.hidden_size == 512 and m.lstm.num_layers == 2 and m.embed.dim == 525
    t = build_model(NeuralLMConfig.preset("paper000-transformer"), big)
    assert len(t.blocks) == 3 and t.blocks[0].ff1.out_features == 1024 and t.embed.embedding_dim == 256
