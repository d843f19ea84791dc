"""``privasr lm``: train, score and adapt language models.

* ``privasr lm train-ngram --text FILE --order N --arpa OUT``: interpolated modified Kneser-Ney exactly as KenLM
  ``lmplz -o N`` estimates it (plus ``--prune`` and ``--vocab``);
* ``privasr lm ppl --lm ARPA --text FILE``: perplexity as SRILM ``ngram -ppl`` and as KenLM ``query`` compute it,
  each labelled (:mod:`privasr.lm.perplexity`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["app", "parse_prune", "read_vocab"]

app = typer.Typer(help="Train, score and adapt language models (ARPA n-grams, class LMs, interpolation, FMA).",
                  no_args_is_help=True)
err_console = make_console(stderr=True)
out_console = make_console()


def parse_prune(text: str | None) -> list[int] | None:
    """``--prune`` thresholds: integers separated by commas or spaces (``"0 0 1"``, ``"0,1"``).

    >>> parse_prune("0 0,1"), parse_prune(None)
    ([0, 0, 1], None)
    """
    if text is None or not text.strip():
        return None
    try:
        return [int(x) for x in re.split(r"[,\s]+", text.strip()) if x]
    except ValueError:
        raise InputError(f"--prune {text!r}", expected="integers like '0 0 1' (one threshold per order)") from None


def read_vocab(path: Path) -> list[str]:
    """Words of a vocabulary file, separated by any whitespace (lmplz ``--limit_vocab_file`` style)."""
    from privasr.corpus.textio import iter_lines, split_words

    words: list[str] = []
    for _, line in iter_lines(path):
        words.extend(split_words(line))
    if not words:
        raise InputError("the vocabulary file has no words", path=path, expected="whitespace-separated words")
    return words


def _read_text(path: Path, what: str) -> list[list[str]]:
    from privasr import progress
    from privasr.lm.ngram.counts import read_sentences

    sents: list[list[str]] = []
    with progress.task(f"reading {what}", transient=True) as bar:
        for k, s in enumerate(read_sentences(path), 1):
            sents.append(s)
            if k % 20000 == 0:
                bar.update(completed=k)
    return sents


@app.command("train-ngram")
def train_ngram(
    text: Annotated[Path, typer.Option("--text", help="Training text: one sentence per line, whitespace tokens "
                                       "(.gz/.xz/.bz2 read transparently).")],
    arpa: Annotated[Path, typer.Option("--arpa", help="Output ARPA file (compressed by suffix).")],
    order: Annotated[int, typer.Option("--order", "-o", help="N-gram order (1-6).")] = 3,
    prune: Annotated[str | None, typer.Option(
        "--prune", help="lmplz-style count thresholds per order, e.g. '0 0 1' drops trigrams (and up) seen once; "
        "first must be 0, non-decreasing, the last repeats.")] = None,
    vocab: Annotated[Path | None, typer.Option(
        "--vocab", help="Vocabulary file (whitespace-separated words): other words are trained as <unk>.")] = None,
    interpolate_unigrams: Annotated[bool, typer.Option(
        "--interpolate-unigrams/--no-interpolate-unigrams",
        help="Interpolate unigrams with the uniform distribution (lmplz default) or give that mass to <unk>.")] = True,
    discount_fallback: Annotated[bool, typer.Option(
        "--discount-fallback", help="Use D=0.5,1,1.5 where the closed-form discounts fail (lmplz option).")] = False,
    skip_symbols: Annotated[bool, typer.Option(
        "--skip-symbols", help="Read <s>, </s> and <unk> in the text as whitespace (lmplz --skip_symbols); by "
        "default they are an error, as in lmplz.")] = False,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write results.json-style figures (options, version, the text's fingerprint, n-gram "
        "counts and discounts per order, timings) to this JSON file.")] = None,
) -> None:
    """Train an interpolated modified Kneser-Ney n-gram model, reproducing KenLM lmplz."""
    from privasr.lm.ngram.arpa import write_arpa
    from privasr.lm.ngram.counts import check_training_text
    from privasr.lm.ngram.mkn import DiscountError, estimate_mkn
    from privasr.outputs import check_output_file

    if not 1 <= order <= 6:
        raise InputError(f"--order {order}", expected="an order from 1 to 6")
    check_output_file(arpa)
    if json_out is not None:
        check_output_file(json_out)
    thresholds = parse_prune(prune)
    words = read_vocab(vocab) if vocab is not None else None
    t0 = time.perf_counter()
    sents = check_training_text(_read_text(text, str(text)), text, skip_symbols=skip_symbols)
    t1 = time.perf_counter()
    try:
        with err_console.status(f"estimating the {order}-gram model"):
            res = estimate_mkn(sents, order, vocab=words, prune=thresholds,
                               discount_fallback=(0.5, 1.0, 1.5) if discount_fallback else None,
                               interpolate_unigrams=interpolate_unigrams)
    except DiscountError as e:  # name this command's option, not the library's argument
        raise InputError(e.message, path=text, expected="more data, or --discount-fallback (D=0.5,1,1.5 where "
                                                        "the estimate fails, as lmplz --discount_fallback)") from None
    t2 = time.perf_counter()
    del sents
    with err_console.status(f"writing {arpa}"):
        write_arpa(res.model, arpa)
    t3 = time.perf_counter()
    err_console.print(f"Unigram tokens {res.tokens} types {len(res.model.vocab)}", highlight=False)
    err_console.print("Statistics:", highlight=False)
    for n, (cnt, d) in enumerate(zip(res.ngram_counts, res.discounts, strict=True), 1):
        kept = res.model.num_ngrams(n)
        pruned = f"/{kept}" if kept != cnt else ""
        err_console.print(f"{n} {cnt}{pruned} D1={d[0]:g} D2={d[1]:g} D3+={d[2]:g}", highlight=False)
    err_console.print(f"read {t1 - t0:.2f}s, estimate {t2 - t1:.2f}s, write {t3 - t2:.2f}s -> {arpa}",
                      highlight=False)
    if json_out is not None:
        from privasr.results import write_results

        per_order = [{"order": n, "ngrams": cnt, "kept": res.model.num_ngrams(n), "discounts": list(d)}
                     for n, (cnt, d) in enumerate(zip(res.ngram_counts, res.discounts, strict=True), 1)]
        write_results(json_out.parent, filename=json_out.name, seed=None,
                      metrics={"tokens": res.tokens, "types": len(res.model.vocab), "orders": per_order,
                               "read_s": t1 - t0, "estimate_s": t2 - t1, "write_s": t3 - t2},
                      config={"command": "lm train-ngram", "text": str(text), "arpa": str(arpa), "order": order,
                              "prune": thresholds, "vocab": None if vocab is None else str(vocab),
                              "interpolate_unigrams": interpolate_unigrams, "discount_fallback": discount_fallback,
                              "skip_symbols": skip_symbols},
                      data={"text": text, "arpa": arpa, **({"vocab": vocab} if vocab is not None else {})})
        err_console.print(f"results: {json_out}", highlight=False)


@app.command("ppl")
def ppl(
    lm: Annotated[Path, typer.Option("--lm", help="ARPA language model (.gz/.xz/.bz2 allowed).")],
    text: Annotated[Path, typer.Option("--text", help="Text to score: one sentence per line.")],
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write the figures (SRILM's and KenLM's, each labelled) to this JSON file.")] = None,
) -> None:
    """Perplexity of a text under an ARPA model, as SRILM's ngram -ppl and as KenLM's query compute it.

    SRILM's figures leave OOV words out and do not add <s> or </s> to a line that already has them; KenLM's score
    every token, markers included, and OOVs as <unk> (-100 when the model has none). See docs/formats.md.
    """
    from privasr.lm.ngram.arpa import read_arpa
    from privasr.lm.perplexity import kenlm_perplexity, srilm_perplexity
    from privasr.metrics.perplexity import format_ppl
    from privasr.outputs import check_output_file

    if json_out is not None:
        check_output_file(json_out)
    with err_console.status(f"reading {lm}"):
        model = read_arpa(lm)
    sents = _read_text(text, str(text))
    if not sents:
        raise InputError("the text has no lines", path=text, expected="one sentence per line")
    srilm = None
    kenlm = None
    with err_console.status("scoring"):
        for lo in range(0, len(sents), 5000):
            part = sents[lo:lo + 5000]
            try:
                s_part, k_part = srilm_perplexity(model, part), kenlm_perplexity(model, part)
            except InputError as e:  # a sentence's index is its line in the chunk
                raise InputError(e.message, path=text, line=None if e.line is None else lo + e.line,
                                 expected=e.expected) from None
            srilm = s_part if srilm is None else srilm + s_part
            kenlm = k_part if kenlm is None else kenlm + k_part
    assert srilm is not None and kenlm is not None
    out_console.print("# SRILM ngram -ppl: OOVs left out, <s> and </s> added unless the line has them",
                      highlight=False, soft_wrap=True)
    out_console.print(format_ppl(srilm, str(text)), highlight=False, soft_wrap=True)
    no_unk = "" if "<unk>" in model else ", -100 for the <unk> this model lacks"
    out_console.print(f"# KenLM query: every token a word (markers too), OOVs as <unk>{no_unk}", highlight=False,
                      soft_wrap=True)
    out_console.print(f"Perplexity including OOVs:\t{kenlm.ppl_including_oovs:g}\n"
                      f"Perplexity excluding OOVs:\t{kenlm.ppl_excluding_oovs:g}\nOOVs:\t{kenlm.oovs}\n"
                      f"Tokens:\t{kenlm.tokens}", highlight=False, soft_wrap=True)
    if json_out is not None:
        from privasr.results import write_results

        metrics: dict[str, Any] = {
            "sentences": srilm.sentences, "words": srilm.words, "oovs": srilm.oovs, "zeroprobs": srilm.zeroprobs,
            "logprob": srilm.logprob, "ppl": srilm.ppl, "ppl1": srilm.ppl1,
            "logprob_incl_oov": kenlm.total, "tokens_incl_eos": kenlm.tokens, "ppl_incl_oov": kenlm.ppl_including_oovs,
            "srilm": {"sentences": srilm.sentences, "words": srilm.words, "oovs": srilm.oovs,
                      "zeroprobs": srilm.zeroprobs, "logprob": srilm.logprob, "ppl": srilm.ppl, "ppl1": srilm.ppl1},
            "kenlm": {"tokens": kenlm.tokens, "oovs": kenlm.oovs, "total": kenlm.total,
                      "ppl_including_oovs": kenlm.ppl_including_oovs,
                      "ppl_excluding_oovs": kenlm.ppl_excluding_oovs, "unk_substituted": "<unk>" not in model},
        }
        write_results(json_out.parent, filename=json_out.name, seed=None, metrics=metrics,
                      config={"command": "lm ppl", "lm": str(lm), "text": str(text), "order": model.order,
                              "conventions": {"ppl, ppl1, logprob, words, oovs, zeroprobs": "SRILM ngram -ppl",
                                              "*_incl_oov, kenlm.*": "KenLM query"}},
                      data={"lm": lm, "text": text})


def _register_adaptation() -> None:
    from privasr.cli import lm_adapt, lm_export, lm_neural_approx

    lm_adapt.register(app)
    lm_neural_approx.register(app)
    lm_export.register(app)


_register_adaptation()


@app.command("train-neural")
def train_neural(
    train: Annotated[Path, typer.Option("--train", help="Training text: one sentence per line (.gz/.xz/.bz2 ok); "
                                        "empty lines are skipped.")],
    valid: Annotated[Path, typer.Option("--valid", help="Validation text, same format.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: best.pt, last.pt, results.json.")],
    config: Annotated[Path | None, typer.Option(
        "--config", help="YAML/JSON file with 'preset', 'model' and 'train' sections.")] = None,
    preset: Annotated[str | None, typer.Option(
        "--preset", help="Model preset: paper000-transformer, paper001-lstm, paper003-lstm (class softmax), "
        "small-transformer, small-lstm, small-lstm-char, small-lstm-class, tiny-*.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override an option: --set layers=2, --set train.lr=0.01, --set max_epochs=5, "
        "--set softmax=class --set classes=100 (repeatable; model.* or train.* names).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from OUT/last.pt (same data and options; "
                                         "max_epochs, max_steps and patience may change).")] = False,
    init: Annotated[Path | None, typer.Option(
        "--init", help="Fine-tune this checkpoint (its architecture and vocabulary; new words become <unk>).")] = None,
    freeze: Annotated[str, typer.Option(
        "--freeze", help="'output': update only the output layer (frozen-layer fine-tuning); 'none': all.")] = "none",
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights, dropout and batch order.")] = 0,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N] (mixed precision only on CUDA).")] = "cpu",
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
    threads: Annotated[int, typer.Option(
        "--threads", help="CPU threads for torch (0: torch's default; 1 is often fastest on a busy machine).")] = 0,
) -> None:
    """Train a neural LM (Transformer or LSTM) from scratch, or fine-tune one (--init, --freeze)."""
    if threads < 0:
        raise InputError(f"--threads {threads}", expected="0 (default) or a positive number of threads")
    if threads:
        from privasr.lm.neural.train import set_num_threads

        set_num_threads(threads)
    from privasr.lm.neural.checkpoint import load_checkpoint
    from privasr.lm.neural.train import load_run_config, train_lm
    from privasr.outputs import check_output_dir, output_dir
    from privasr.results import write_results

    check_output_dir(out)
    init_ck = load_checkpoint(init) if init is not None else None
    last_ck = load_checkpoint(out / "last.pt") if resume else None
    base = init_ck.config if init_ck is not None else None
    if last_ck is not None and config is None and preset is None:
        base = last_ck.config
    model_cfg, opts = load_run_config(config, preset, overrides or [], init_config=base)
    train_sents = [s for s in _read_text(train, str(train)) if s]
    valid_sents = [s for s in _read_text(valid, str(valid)) if s]
    data: dict[str, Any] = {"train": train, "valid": valid}
    if init is not None:
        data["init"] = init
    with output_dir(out):
        res = train_lm(train_sents, valid_sents, model_cfg, opts, out_dir=out, init=init_ck, freeze=freeze,
                       seed=seed, device=device, progress=progress, resume=resume)
        write_results(out, config={"model": res.config.to_dict(), **res.run}, seed=seed, metrics=res.metrics,
                      data=data)
    m = res.metrics
    err_console.print(
        f"{m['epochs_completed']} epochs, {res.steps} steps, {res.tokens_per_s:,.0f} tokens/s; valid ppl "
        f"{res.initial_valid_ppl:.2f} -> best {res.best_valid_ppl:.2f} (epoch {res.best_epoch:.2f})"
        f"{' [stopped early]' if res.stopped_early else ''}; {out}/best.pt", highlight=False)
