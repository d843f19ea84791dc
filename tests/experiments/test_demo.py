"""The end-to-end demo writes results.json and report.md with sane, reproducible numbers."""

import json

import pytest

from privasr.cli import main


def test_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--seed", "3", "--preset", "tiny"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert {"config", "seed", "version", "data", "metrics"} <= set(res)
    assert res["seed"] == 3
    m = res["metrics"]
    assert 0 < m["wer_oracle"] < m["wer_1best"] < 1
    assert m["oracle_mapsswe_z"] > 0 and 0 <= m["oracle_mapsswe_p"] <= 1
    best = m["best_on_dev"]  # chosen on dev, never on test; its test WER is the headline's
    assert m["wer_system"] == best["system"] and m["wer"] == best["test_wer"] and m["wer_baseline"] == m["wer_1best"]
    assert best["dev_errors"] == min(c["dev_errors"] for c in best["candidates"]) and best["dev_wer"] == m["wer_dev"]
    assert f"Best on the dev clients: {best['system']}" in (out / "report.md").read_text() or \
        best["system"] == m["wer_baseline_system"]
    assert m["wer_rel_change"] == pytest.approx((m["wer"] - m["wer_baseline"]) / m["wer_baseline"])
    assert m["mapsswe_p"] is None or 0 <= m["mapsswe_p"] <= 1  # None: the first pass or an NNLM system is best
    lo, hi = m["oracle_bootstrap_ci"]
    assert lo <= m["wer_oracle"] - m["wer_1best"] <= hi < 0  # system (oracle) minus baseline (1-best)
    report = (out / "report.md").read_text()
    assert "| first-pass 1-best |" in report and "MAPSSWE" in report
    assert "| n-gram rescoring (background 3-gram, tuned on dev) |" in report
    assert f"| {100 * m['wer_ngram_rescoring']:.2f} |" in report
    assert 0 < m["wer_ngram_rescoring"] < 1 and set(m["ngram_rescoring_weights"]) == {"lm", "bg3", "word_penalty"}
    assert f"{100 * m['wer_1best']:.2f}" in report
    ftl = m["ftl"]
    if ftl is not None:  # federated acoustic training (needs torch)
        assert ftl["valid_loss"] < ftl["valid_loss_seed"] and 0 <= ftl["cer"] <= ftl["wer"]
        assert "## Federated acoustic-model training (paper 002)" in report
        assert ftl["wer_system"].startswith("FTL (") and ftl["wer_baseline_system"].startswith("FedAvg (")
        assert "None" not in (out / "ftl" / "report.md").read_text()
        # what FTL is for, said first: rounds to the target validation loss of both systems
        assert "What FTL is for is reaching a good model in fewer rounds" in report
        assert (f"FTL reaches it at round {ftl['rounds_to_target']}" in report
                or f"FTL reaches it not within {ftl['rounds']} rounds" in report)
    anon = m["anon"]  # anonymisation of the clients' transcripts (paper 003)
    assert 0 <= anon["leak_rate"] <= 1 and anon["name_tokens_left"] <= anon["name_tokens_before"]
    assert anon["ppl_original"] > 1 and anon["ppl_anonymized"] > 1
    tagged = (out / "anon" / "transcripts_test.tag.jsonl").read_text().splitlines()
    assert len(tagged) == len((out / "anon" / "transcripts_test.surrogate.jsonl").read_text().splitlines()) > 0
    assert "## Anonymised transcripts (paper 003)" in report
    # Same seed, same numbers (timings aside).
    out2 = tmp_path / "demo2"
    assert main(["demo", "--out", str(out2), "--seed", "3", "--preset", "tiny"]) == 0
    m2 = json.loads((out2 / "results.json").read_text())["metrics"]
    drop = lambda d: {k: v for k, v in d.items() if k != "timings"}  # noqa: E731
    assert drop(m) == drop(m2)


def test_report_and_results_agree_on_every_figure_they_share(tmp_path):
    """report.md's WER table, headline and intervals are results.json's numbers, row by row."""
    import re

    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--seed", "1", "--preset", "tiny"]) == 0
    res = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith("| system")]
    rows = res["systems"]
    assert len(table) >= len(rows)
    for row, line in zip(rows, table, strict=False):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells == [row["system"], f"{100 * row['wer']:.2f}", str(row["sub"]), str(row["del"]),
                         str(row["ins"]), str(row["words"])]
    m = res["metrics"]
    assert f"test WER {100 * m['wer']:.2f}%" in report and m["wer_system"] in report
    lo, hi = m["oracle_bootstrap_ci"]
    assert f"[{100 * lo:+.2f}, {100 * hi:+.2f}] points" in report
    assert re.search(r"WER\(N-best oracle\) - WER\(first-pass 1-best\)", report)
