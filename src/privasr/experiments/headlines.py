"""The headline check behind ``privasr headlines`` (``make headlines``): rerun the commands behind
docs/results.md's headline figures and fail on drift beyond a stated tolerance.

A figure can drift without any change to its method: the NNLM these commands train is a function of the trainer's
floating-point arithmetic, and 8,000 steps turn a rounding difference of 1e-7 into another model (docs/results.md,
"Figures that reproduce"). The check reruns each headline's command as a fresh process
(``python -m privasr --quiet COMMAND --out OUT/NAME``), by default with a fresh LM cache (``OUT/cache``, named to
the command by the headline's ``cache`` key, e.g. ``cache_dir``), so the NNLMs are trained again by today's code;
then it compares each expected metric of the run's ``results.json`` with the recorded value:
``|got - want| <= tolerance`` (absolute, in the metric's unit: WERs as fractions).

The headlines file (``configs/headlines.yaml``)::

    tolerance: {wer: 0.0005, wer_baseline: 0.0005, wer_rel_change: 0.003}  # per metric, absolute
    headlines:
      - name: fmp-ami-adapted
        command: [fmp, run, --config, configs/fmp-ami-adapted.yaml, --set, "tables={}"]
        cache: cache_dir                  # the config key the fresh cache goes to (null: none)
        commit: 2f1bb91                   # the commit whose run recorded the values
        metrics: {wer: 0.16921, wer_baseline: 0.17385}
        tolerance: {}                     # overrides for this headline

The run writes ``OUT/results.json`` (every headline's expected and measured values, differences and verdicts) and
``OUT/report.md``; ``drifted`` counts the metrics outside their tolerance and the failed commands.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.config import Context, from_mapping, setting, to_dict
from privasr.errors import ConfigError

__all__ = ["Headline", "HeadlinesConfig", "load_headlines", "run_headlines", "compare"]


@dataclass(frozen=True)
class Headline:
    """One headline: the ``privasr`` arguments that produce it (without ``--out``), the metrics it recorded, the
    config key that takes the LM cache, the commit that recorded it and per-metric tolerance overrides."""

    name: str
    command: tuple[str, ...]
    metrics: dict[str, float]
    cache: str | None = None
    commit: str | None = None
    tolerance: dict[str, float] = field(default_factory=dict)

    def __config_check__(self, where: str, ctx: Context) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"config key '{where}.name' is {self.name!r}", expected="a folder name")
        if not self.command or "--out" in self.command:
            raise ConfigError(f"config key '{where}.command' is {list(self.command)!r}",
                              expected="privasr arguments without --out (the check gives each run its folder)")
        if not self.metrics:
            raise ConfigError(f"config key '{where}.metrics' is empty", expected="the recorded metrics to compare")
        if any(t < 0 for t in self.tolerance.values()):
            raise ConfigError(f"config key '{where}.tolerance' is {self.tolerance!r}", expected="tolerances >= 0")


@dataclass(frozen=True, kw_only=True)
class HeadlinesConfig:
    """The headlines file (module docstring)."""

    tolerance: dict[str, float] = field(default_factory=dict)
    default_tolerance: float = setting(0.0, min=0.0)
    headlines: tuple[Headline, ...]

    def __config_check__(self, where: str, ctx: Context) -> None:
        if not self.headlines:
            raise ConfigError("config key 'headlines' is empty", expected="one headline or more")
        names = [h.name for h in self.headlines]
        if len(set(names)) != len(names):
            raise ConfigError(f"config key 'headlines' repeats a name: {names}", expected="distinct names")
        if any(t < 0 for t in self.tolerance.values()):
            raise ConfigError(f"config key 'tolerance' is {self.tolerance!r}", expected="tolerances >= 0")

    def tolerance_of(self, headline: Headline, metric: str) -> float:
        """The headline's own tolerance for ``metric``, else the file's, else ``default_tolerance``."""
        return float(headline.tolerance.get(metric, self.tolerance.get(metric, self.default_tolerance)))


def load_headlines(raw: Mapping[str, Any]) -> HeadlinesConfig:
    """Validate a headlines mapping (module docstring).

    >>> cfg = load_headlines({"tolerance": {"wer": 0.001}, "headlines": [
    ...     {"name": "a", "command": ["rescore", "run", "--config", "c.yaml"], "metrics": {"wer": 0.2}}]})
    >>> cfg.tolerance_of(cfg.headlines[0], "wer"), cfg.tolerance_of(cfg.headlines[0], "ppl")
    (0.001, 0.0)
    >>> load_headlines({"headlines": [{"name": "a", "command": ["x", "--out", "d"], "metrics": {"wer": 0.2}}]})
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'headlines[0].command' is ['x', '--out', 'd'] (expected privasr arguments without --out (the check gives each run its folder))
    """
    return from_mapping(HeadlinesConfig, raw, "", Context(False))


def compare(want: Mapping[str, float], got: Mapping[str, Any], tolerance: Mapping[str, float]
            ) -> list[dict[str, Any]]:
    """One row per expected metric: ``want``, ``got`` (``None`` if the run did not report it), ``diff`` and
    ``ok`` (``|got - want| <= tolerance``; a missing or non-numeric value is a failure).

    >>> [r["ok"] for r in compare({"wer": 0.2, "ppl": 100.0}, {"wer": 0.2004, "ppl": 102.0},
    ...                           {"wer": 0.0005, "ppl": 1.0})]
    [True, False]
    """
    rows = []
    for k, w in want.items():
        g = got.get(k)
        num = isinstance(g, int | float) and not isinstance(g, bool)
        diff = float(g) - float(w) if num else None
        rows.append({"metric": k, "want": float(w), "got": float(g) if num else None, "diff": diff,
                     "tolerance": float(tolerance[k]), "ok": diff is not None and abs(diff) <= tolerance[k]})
    return rows


def _run_one(h: Headline, out: Path, cache: Path | None) -> tuple[int, str, float]:
    """Run the headline's command; its exit status, the tail of its output and its seconds."""
    cmd = [sys.executable, "-m", "privasr", "--quiet", *h.command, "--out", str(out / h.name)]
    if h.cache is not None and cache is not None:
        cmd += ["--set", f"{h.cache}={cache}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr)[-2000:], time.perf_counter() - t0


def run_headlines(cfg: HeadlinesConfig, out: str | Path, *, cache: str | Path | None = None,
                  only: Sequence[str] = (), argv: Sequence[str] | None = None,
                  on_done: Any = None) -> dict[str, Any]:
    """Rerun the headlines (``only``: these names) into ``out/NAME`` and compare (module docstring); write
    ``out/results.json`` and ``out/report.md``. ``cache``: the LM cache the commands use (default a fresh
    ``out/cache``: every NNLM trained again). ``on_done(name, rows)`` is called after each headline.

    Returns:
        The metrics: ``headlines`` run, ``drifted`` (metrics outside tolerance plus failed commands),
        ``failed_commands``, ``seconds``.

    Raises:
        ConfigError: a name in ``only`` that the file does not have.
    """
    from privasr.results import write_results

    names = [h.name for h in cfg.headlines]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"--only {', '.join(unknown)}: no such headline", expected=f"one of {', '.join(names)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache) if cache is not None else out / "cache"
    t_start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for h in cfg.headlines:
        if only and h.name not in only:
            continue
        code, tail, secs = _run_one(h, out, cache_dir)
        got: dict[str, Any] = {}
        res_path = out / h.name / "results.json"
        if code == 0 and res_path.is_file():
            got = json.loads(res_path.read_text(encoding="utf-8")).get("metrics", {})
        rows = compare(h.metrics, got, {k: cfg.tolerance_of(h, k) for k in h.metrics})
        run = {"name": h.name, "command": ["privasr", *h.command], "recorded_at": h.commit, "exit_status": code,
               "seconds": secs, "rows": rows, "ok": code == 0 and all(r["ok"] for r in rows)}
        if code != 0:
            run["output_tail"] = tail
        runs.append(run)
        if on_done is not None:
            on_done(h.name, run)
    failed = sum(1 for r in runs if r["exit_status"] != 0)
    drifted = failed + sum(1 for r in runs if r["exit_status"] == 0 for row in r["rows"] if not row["ok"])
    metrics = {"headlines": len(runs), "drifted": drifted, "failed_commands": failed,
               "seconds": time.perf_counter() - t_start}
    write_results(out, runner="headlines", config=to_dict(cfg), seed=None, metrics=metrics,
                  extra={"runs": runs, "cache": str(cache_dir), "command": list(argv) if argv else None})
    (out / "report.md").write_text(_report(runs, metrics, cache_dir, argv), encoding="utf-8")
    return metrics


def _report(runs: Sequence[Mapping[str, Any]], m: Mapping[str, Any], cache: Path, argv: Sequence[str] | None
            ) -> str:
    verdict = "no drift" if m["drifted"] == 0 else f"{m['drifted']} drifted (metrics or failed commands)"
    lines = ["# Headline check", ""]
    if argv:
        lines += ["Command: `" + " ".join(argv) + "`", ""]
    lines += [f"{m['headlines']} headlines rerun with the LM cache `{cache}`: **{verdict}**.", "",
              "| headline | metric | recorded | now | difference | tolerance | verdict |",
              "|---|---|---:|---:|---:|---:|---|"]
    for r in runs:
        if r["exit_status"] != 0:
            lines.append(f"| {r['name']} | (command) | | | | | failed, exit status {r['exit_status']} |")
            continue
        for row in r["rows"]:
            now = "missing" if row["got"] is None else f"{row['got']:.6g}"
            diff = "" if row["diff"] is None else f"{row['diff']:+.3g}"
            lines.append(f"| {r['name']} | {row['metric']} | {row['want']:.6g} | {now} | {diff} | "
                         f"{row['tolerance']:g} | {'ok' if row['ok'] else 'DRIFT'} |")
    lines += [""]
    for r in runs:
        lines.append(f"- {r['name']}: `{' '.join(r['command'])}` ({r['seconds']:.0f} s; values recorded at "
                     f"{r['recorded_at'] or 'an unrecorded commit'})")
        if r.get("output_tail"):
            lines += ["", "```", r["output_tail"].rstrip(), "```", ""]
    lines += ["", f"privasr {__version__}.", ""]
    return "\n".join(lines)
