"""``privasr lm train-class | mix | fma``: class n-grams, interpolation and fast marginal adaptation.

:func:`register` adds the three commands to the ``privasr lm`` typer app. Input problems raise
:class:`~privasr.errors.InputError`, which ``privasr`` prints as one line (exit status 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["register", "parse_weights"]

out_console = make_console()


def parse_weights(text: str) -> list[float]:
    """Comma-separated interpolation weights.

    >>> parse_weights("0.25, 0.75")
    [0.25, 0.75]
    """
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--weights {text!r}", expected="comma-separated numbers, e.g. 0.3,0.7") from None


def _sentences(path: Path) -> list[list[str]]:
    from privasr.lm.ngram.counts import read_sentences

    return list(read_sentences(path))


def _heldout(path: Path) -> list[list[str]]:
    """Held-out text as SRILM reads it: a line's own leading ``<s>`` and trailing ``</s>`` are its markers (dropped
    here, added back by scoring); a marker inside a line is refused at its line."""
    from privasr.lm.perplexity import check_markers, strip_markers

    out = []
    for k, s in enumerate(_sentences(path), start=1):
        try:
            check_markers(s)
        except InputError as e:
            raise e.at(path, k) from None
        out.append(strip_markers(s))
    return out


def _training_text(path: Path) -> list[list[str]]:
    """Training text: ``<s>``, ``</s>`` and ``<unk>`` refused at their line, as lmplz does."""
    from privasr.lm.ngram.counts import check_training_text

    return check_training_text(_sentences(path), path)


def _ppl(label: str, lm: Any, sentences: list[list[str]], metrics: dict[str, Any], path: Path | None = None) -> None:
    """Print SRILM's perplexity line (``ngram -ppl``'s conventions: :func:`privasr.lm.perplexity.srilm_perplexity`)
    for ``label`` and record its figures in ``metrics[label]``."""
    from privasr.lm.perplexity import srilm_perplexity

    try:
        s = srilm_perplexity(lm, sentences)
    except InputError as e:  # a sentence's index is its line
        raise e.at(path) from None
    metrics[label] = {"sentences": s.sentences, "words": s.words, "oovs": s.oovs, "ppl": s.ppl, "ppl1": s.ppl1}
    out_console.print(f"{label}: {s.sentences} sentences, {s.words} words, {s.oovs} OOVs, ppl= {s.ppl:.6g} "
                      f"ppl1= {s.ppl1:.6g}")


_RESULTS_HELP = "Also write results.json to this file (the options, version, the inputs' fingerprints, metrics)."


def _results(path: Path | None, command: str, config: dict[str, Any], metrics: dict[str, Any],
             data: dict[str, Any]) -> None:
    """``path`` as results.json of ``command`` (nothing when ``path`` is ``None``)."""
    if path is None:
        return
    from privasr.results import write_results

    write_results(path.parent, filename=path.name, seed=None, metrics=metrics,
                  config={"command": command, **{k: str(v) if isinstance(v, Path) else v for k, v in config.items()}},
                  data={k: v for k, v in data.items() if v is not None})
    out_console.print(f"results: {path}", highlight=False)


def train_class(
    text: Annotated[Path, typer.Option("--text", help="Training text, one sentence per line (.gz/.xz ok).")],
    classes: Annotated[Path, typer.Option("--classes", help="Word classes, SRILM classes-format "
                                          "('class [p] word' per line, single-word expansions).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: class.arpa, members.classes, "
                                      "word.arpa.")],
    order: Annotated[int, typer.Option("--order", help="N-gram order of the class LM.")] = 3,
    member_probs: Annotated[str, typer.Option(
        "--member-probs", help="P(w|c) source: 'auto' (the classes file where every line of a class gives "
        "p, else training counts), 'counts' or 'file'.")] = "auto",
    add_k: Annotated[float, typer.Option("--add-k", help="Add-k constant for P(w|c) from counts (0: maximum "
                                         "likelihood; unseen members are then left out).")] = 0.0,
    expand: Annotated[bool, typer.Option("--expand/--no-expand", help="Also write the expanded word ARPA "
                                         "(exact; for first-pass decoders).")] = True,
    max_ngrams: Annotated[int, typer.Option("--max-ngrams", help="Refuse expansions larger than this.")]
    = 20_000_000,
) -> None:
    """Train a class n-gram (modified Kneser-Ney on the class-mapped text) and its member distributions; the
    figures go to OUT/results.json."""
    from privasr.lm.ngram.arpa import write_arpa
    from privasr.lm.ngram.class_lm import expand_to_word_arpa, train_class_lm
    from privasr.lm.ngram.classes import read_classes, write_classes
    from privasr.outputs import check_output_dir

    check_output_dir(out)
    if member_probs not in ("auto", "counts", "file"):
        raise InputError(f"--member-probs {member_probs!r}", expected="auto, counts or file")
    cmap = read_classes(classes)
    sents = _training_text(text)
    model = train_class_lm(sents, cmap, order, member_probs=member_probs, k=add_k)  # type: ignore[arg-type]
    out.mkdir(parents=True, exist_ok=True)
    write_arpa(model.class_lm, out / "class.arpa")
    write_classes(cmap, out / "members.classes", model.member_probs)
    counts = ", ".join(str(model.class_lm.num_ngrams(n)) for n in range(1, model.order + 1))
    out_console.print(f"class LM: order {model.order}, n-grams [{counts}] -> {out / 'class.arpa'}")
    out_console.print(f"member distributions of {len(model.member_probs)} classes -> {out / 'members.classes'}")
    if expand:
        word = expand_to_word_arpa(model, max_ngrams=max_ngrams)
        write_arpa(word, out / "word.arpa")
        wc = ", ".join(str(word.num_ngrams(n)) for n in range(1, word.order + 1))
        out_console.print(f"expanded word LM: n-grams [{wc}] -> {out / 'word.arpa'}")
    metrics: dict[str, Any] = {
        "class_ngrams": [model.class_lm.num_ngrams(n) for n in range(1, model.order + 1)],
        "classes": len(model.member_probs), "sentences": len(sents)}
    if expand:
        metrics["word_ngrams"] = [word.num_ngrams(n) for n in range(1, word.order + 1)]
    _results(out / "results.json", "lm train-class", {"text": text, "classes": classes, "order": order,
             "member_probs": member_probs, "add_k": add_k, "expand": expand, "max_ngrams": max_ngrams},
             metrics, {"text": text, "classes": classes})


def mix(
    lm: Annotated[list[Path], typer.Option("--lm", help="An ARPA model (give --lm once per component).")],
    weights: Annotated[str | None, typer.Option("--weights", help="Comma-separated weights, one per --lm "
                                                "(summing to 1). Without them, --heldout is required.")]
    = None,
    heldout: Annotated[Path | None, typer.Option("--heldout", help="Held-out text: EM weights (SRILM "
                                                 "compute-best-mix) when --weights is not given, and its "
                                                 "perplexity.")] = None,
    arpa: Annotated[Path | None, typer.Option("--arpa", help="Write the statically merged model here.")]
    = None,
    tol: Annotated[float, typer.Option("--tol", help="EM stops when no weight changes by more than this, "
                                       "relatively.")] = 1e-6,
    results: Annotated[Path | None, typer.Option("--results", help=_RESULTS_HELP)] = None,
) -> None:
    """Interpolate language models linearly: EM weights on held-out text, merged ARPA."""
    from privasr.lm.mix import EmIteration, LinearMix, estimate_weights, merge_ngrams
    from privasr.lm.ngram.arpa import read_arpa, write_arpa
    from privasr.outputs import check_output_file

    for target in (arpa, results):
        if target is not None:
            check_output_file(target)
    if len(lm) < 2:
        raise InputError(f"{len(lm)} --lm given", expected="at least two models to interpolate")
    if weights is None and heldout is None:
        raise InputError("neither --weights nor --heldout given", expected="one of them")
    models = [read_arpa(p) for p in lm]
    held = _heldout(heldout) if heldout is not None else None
    if weights is not None:
        w = parse_weights(weights)
        mixture = LinearMix(models, w)
        w = [float(x) for x in mixture.weights]
    else:
        assert held is not None

        def show(it: EmIteration) -> None:
            ws = " ".join(f"{x:.6f}" for x in it.weights)
            out_console.print(f"iteration {it.iteration}: weights {ws} ppl= {it.ppl:.6g}")

        res = estimate_weights(models, held, tol=tol, callback=show)
        w = list(res.weights)
        state = "converged" if res.converged else "did NOT converge"
        out_console.print(f"EM {state} after {len(res.iterations)} iterations on {res.tokens} tokens")
        mixture = LinearMix(models, w)
    out_console.print("weights: " + " ".join(f"{x:.6f}" for x in w))
    metrics: dict[str, Any] = {"weights": w}
    if held is not None:
        ppl: dict[str, Any] = {}
        for i, (p, m) in enumerate(zip(lm, models, strict=True)):
            _ppl(p.name if p.name not in ppl else f"{p.name}#{i}", m, held, ppl, heldout)
        _ppl("mixture", mixture, held, ppl, heldout)
        metrics["heldout"] = ppl
    if arpa is not None:
        merged = merge_ngrams(models, w)
        write_arpa(merged, arpa)
        counts = ", ".join(str(merged.num_ngrams(n)) for n in range(1, merged.order + 1))
        out_console.print(f"merged model: n-grams [{counts}] -> {arpa}")
        metrics["merged_ngrams"] = [merged.num_ngrams(n) for n in range(1, merged.order + 1)]
    _results(results, "lm mix", {"lm": [str(p) for p in lm], "weights": weights, "heldout": heldout, "arpa": arpa,
                                 "tol": tol}, metrics,
             {**{f"lm{i}": p for i, p in enumerate(lm)}, "heldout": heldout})


def fma(
    lm: Annotated[Path, typer.Option("--lm", help="Background ARPA model.")],
    adapt_text: Annotated[Path, typer.Option("--adapt-text", help="Adaptation text (one sentence per line).")],
    arpa: Annotated[Path, typer.Option("--arpa", help="Write the adapted model (exact rewrite) here.")],
    beta: Annotated[float, typer.Option("--beta", help="Adaptation strength (0 = no change).")] = 0.5,
    smoothing: Annotated[str, typer.Option("--smoothing", help="Adaptation unigram: 'dirichlet' (prior = base "
                                           "unigram, strength --mu) or 'add-k' (--k).")] = "dirichlet",
    mu: Annotated[float, typer.Option("--mu", help="Dirichlet prior strength (in tokens).")] = 1000.0,
    k: Annotated[float, typer.Option("--k", help="Add-k constant.")] = 0.5,
    base_text: Annotated[Path | None, typer.Option("--base-text", help="Background training text: its "
                                                   "(add-0.5) unigram is used as P_B(w) instead of the "
                                                   "model's unigram probabilities.")] = None,
    heldout: Annotated[Path | None, typer.Option("--heldout", help="Report perplexities before and after "
                                                 "on this text.")] = None,
    results: Annotated[Path | None, typer.Option("--results", help=_RESULTS_HELP)] = None,
) -> None:
    """Fast marginal adaptation of an ARPA model towards the unigram of adaptation text."""
    from privasr.lm.adapt.fma import adaptation_unigram, fma_rewrite, text_unigram
    from privasr.lm.ngram.arpa import read_arpa, write_arpa
    from privasr.outputs import check_output_file

    for target in (arpa, results):
        if target is not None:
            check_output_file(target)
    if smoothing not in ("dirichlet", "add-k"):
        raise InputError(f"--smoothing {smoothing!r}", expected="dirichlet or add-k")
    base = read_arpa(lm)
    pb = text_unigram(_training_text(base_text), base, k=0.5) if base_text is not None else None
    pa = adaptation_unigram(_training_text(adapt_text), base, smoothing=smoothing, mu=mu, k=k,  # type: ignore[arg-type]
                            base_unigram=pb)
    adapted = fma_rewrite(base, pa, beta, pb)
    write_arpa(adapted, arpa)
    out_console.print(f"adapted model (beta {beta:g}) -> {arpa}")
    metrics: dict[str, Any] = {}
    if heldout is not None:
        held = _heldout(heldout)
        _ppl("base", base, held, metrics, heldout)
        _ppl("adapted", adapted, held, metrics, heldout)
    _results(results, "lm fma", {"lm": lm, "adapt_text": adapt_text, "arpa": arpa, "beta": beta,
                                 "smoothing": smoothing, "mu": mu, "k": k, "base_text": base_text,
                                 "heldout": heldout}, metrics,
             {"lm": lm, "adapt_text": adapt_text, "base_text": base_text, "heldout": heldout})


def register(app: typer.Typer) -> None:
    """Add ``train-class``, ``mix`` and ``fma`` to ``app`` (the ``privasr lm`` group)."""
    app.command("train-class")(train_class)
    app.command("mix")(mix)
    app.command("fma")(fma)
