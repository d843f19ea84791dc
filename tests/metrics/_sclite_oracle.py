"""Run NIST sclite (Debian package ``sctk``) on trn files and read its per-sentence and per-speaker counts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from privasr.bench.metrics import sclite_binary

__all__ = ["run_sclite"]

_SCORES = re.compile(r"Scores: \(#C #S #D #I\) (\d+) (\d+) (\d+) (\d+)")
_ROW = re.compile(r"\|\s*(\S+)\s*\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|")


def run_sclite(ref: Path, hyp: Path, out: Path, options: tuple[str, ...] = ()
               ) -> tuple[dict[str, tuple[int, int, int, int]], dict[str, dict[str, int]]]:
    """sclite's counts of ``hyp`` against ``ref`` (trn files, ``-i spu_id``): per utterance id ``(C, S, D, I)``
    from its ``pralign`` report, and per speaker (and ``Sum``) its ``rsum`` row
    (``sentences, words, corr, sub, del, ins, err, sentence_errors``)."""
    exe = sclite_binary()
    assert exe is not None
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([exe, "-r", str(ref), "trn", "-h", str(hyp), "trn", "-i", "spu_id", "-o", "pralign", "rsum",
                    "-O", str(out), "-n", "sc", "-f", "0", *options], check=True, capture_output=True)
    per_utt: dict[str, tuple[int, int, int, int]] = {}
    current = None
    for line in (out / "sc.pra").read_text(errors="replace").splitlines():
        if line.startswith("id: ("):
            current = line[5:line.rindex(")")]
        m = _SCORES.match(line)
        if m and current is not None:
            per_utt[current] = tuple(int(x) for x in m.groups())  # type: ignore[assignment]
    keys = ("sentences", "words", "corr", "sub", "del", "ins", "err", "sentence_errors")
    per_spk = {}
    for line in (out / "sc.raw").read_text(errors="replace").splitlines():
        m = _ROW.search(line)
        if m and m.group(1) not in ("SPKR", "Mean", "S.D.", "Median"):
            per_spk[m.group(1)] = dict(zip(keys, map(int, m.groups()[1:]), strict=True))
    return per_utt, per_spk
