"""FTL's model bundle: the operator writes it; a device turns its own recordings' features and transcripts into
its FTL client with it.

What the bundle holds (:func:`write_ftl_bundle`): ``settings.json`` with ``ftl`` (the
:class:`~privasr.federated.algorithms.ftl.FtlConfig`: client optimiser, steps, weighting), ``model`` (the
:class:`~privasr.asr.models.AcousticConfig`), ``units`` (the tokenizer, :meth:`to_dict
<privasr.asr.units.Tokenizer.to_dict>`: characters, or the sentencepiece model in base64), ``features`` (CMVN mode
and frame stacking), ``rounds`` and ``run``. The acoustic model's weights come with every round's payload.

A device's files (:func:`read_transcripts`): a transcript file in Kaldi ``text`` format (``utt_id WORD ...`` per
line) and, beside it, one Sphinx ``.mfc`` feature file per utterance, ``<utt_id>.mfc`` (13 cepstra a frame, as
AN4's). Each round the device makes its client from every utterance taken so far: speaker CMVN over its own
utterances (the device is one speaker), frame stacking, the units of the transcript
(:func:`~privasr.asr.train.an4_examples`). :func:`write_ftl_replay` writes such folders for a test bed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.device.bundle import Bundle, build_model, write_bundle
from privasr.errors import ConfigError, InputError

__all__ = ["write_ftl_bundle", "FtlDeviceModel", "FTL_BUNDLE", "read_transcripts", "write_ftl_replay",
           "COMPANION_SUFFIXES"]

FTL_BUNDLE = "ftl"
COMPANION_SUFFIXES = (".mfc",)
"""Files that belong to a transcript file (taken with it, never alone)."""


def write_ftl_bundle(folder: str | os.PathLike[str], *, algorithm: Any, cmvn: str, rounds: int,
                     run: Mapping[str, Any] | None = None) -> str:
    """Write FTL's bundle into the new folder ``folder``; its hash.

    Args:
        algorithm: the server's :class:`~privasr.federated.algorithms.ftl.FtlAlgorithm`.
        cmvn: ``speaker`` (each device normalises with its own statistics) or ``none``.

    Raises:
        ConfigError: another CMVN (``global`` needs the training set's statistics, which a device lacks).
    """
    if cmvn not in ("speaker", "none"):
        raise ConfigError(f"data.cmvn={cmvn!r} on devices", expected="speaker or none")
    settings = {"ftl": algorithm.config.to_dict(), "model": algorithm.model_config.to_dict(),
                "units": algorithm.tokenizer.to_dict(), "features": {"cmvn": cmvn, "stack": 3},
                "rounds": int(rounds), "run": dict(run or {})}
    return write_bundle(folder, FTL_BUNDLE, settings, {"none": np.zeros(0)})


@dataclass(frozen=True)
class Recording:
    """One utterance on a device: its id, transcript words and ``(frames, 13)`` features."""

    utt_id: str
    words: tuple[str, ...]
    features: np.ndarray


def read_transcripts(path: str | os.PathLike[str]) -> list[Recording]:
    """The utterances of a Kaldi ``text`` transcript file with their ``<utt_id>.mfc`` features beside it.

    Raises:
        InputError: naming the file and line: a line without words, a missing or unreadable feature file.
    """
    from privasr.asr.features import read_sphinx_mfc
    from privasr.corpus.formats.kaldi_text import read_kaldi_text

    p = Path(path)
    out = []
    for k, t in enumerate(read_kaldi_text(p), 1):
        if not t.words:
            raise InputError(f"utterance {t.utt_id!r} has no words", path=p, line=k, expected="a transcript")
        mfc = p.parent / f"{t.utt_id}.mfc"
        if not mfc.is_file():
            raise InputError(f"no feature file {mfc.name} for utterance {t.utt_id!r}", path=p, line=k,
                             expected="<utt_id>.mfc beside the transcript file")
        out.append(Recording(t.utt_id, tuple(t.words), read_sphinx_mfc(mfc)))
    if not out:
        raise InputError("holds no utterances", path=p, expected="'utt_id WORD ...' lines")
    return out


def _write_mfc(path: Path, x: np.ndarray) -> None:
    a = np.ascontiguousarray(x, dtype=">f4")
    path.write_bytes(struct.pack(">i", a.size) + a.tobytes())


def write_ftl_replay(utterances: Sequence[Any], out: str | os.PathLike[str], *, rounds: int
                     ) -> list[tuple[str, Path]]:
    """Cut AN4-like utterances (:class:`~privasr.asr.features.An4Utterance`) into one replay folder per speaker:
    ``out/<i>/round-<t>/part-<t>.txt`` (Kaldi text) with the round's ``<utt_id>.mfc`` files, the speaker's
    utterances in order split into ``rounds + 1`` groups (:func:`~privasr.corpus.partition.time_rounds`'s sizes).
    Returns ``(speaker, folder)`` per speaker, speakers sorted.

    Raises:
        ConfigError: ``out`` exists and is not empty.
    """
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ConfigError(f"{root} exists and is not an empty folder", expected="a new folder")
    by: dict[str, list[Any]] = {}
    for u in utterances:
        by.setdefault(u.speaker, []).append(u)
    result = []
    for i, spk in enumerate(sorted(by)):
        folder = root / str(i)
        folder.mkdir(parents=True)
        for t, g in enumerate(np.array_split(np.arange(len(by[spk])), rounds + 1)):
            if not len(g):
                continue
            d = folder / f"round-{t}"
            d.mkdir()
            lines = []
            for j in g:
                u = by[spk][int(j)]
                _write_mfc(d / f"{u.utt_id}.mfc", u.features)
                lines.append(f"{u.utt_id} {' '.join(u.words)}\n")
            (d / f"part-{t:03d}.txt").write_text("".join(lines), encoding="utf-8")
        result.append((spk, folder))
    return result


@dataclass
class FtlDeviceModel:
    """What a device builds from FTL's bundle: the tokenizer, the acoustic model's configuration and the
    feature settings."""

    bundle: Bundle
    tokenizer: Any
    cmvn: str
    rounds: int

    @classmethod
    def load(cls, folder: str | os.PathLike[str] | Bundle, *,
             expected: str | None = None) -> FtlDeviceModel:
        """Read FTL's bundle from ``folder`` and build the model.

        Raises:
            InputError: a bundle of another kind or hash, or settings that do not make the model.
        """
        def build(b: Bundle) -> FtlDeviceModel:
            import json

            from privasr.asr.units import tokenizer_from_json

            s = b.settings
            tok = tokenizer_from_json(json.dumps(s["units"]))
            cmvn = s["features"]["cmvn"]
            if cmvn not in ("speaker", "none"):
                raise ValueError(f"cmvn {cmvn!r}")
            model = cls(b, tok, cmvn, int(s["rounds"]))
            model.algorithm()
            return model

        return build_model(folder, expected, FTL_BUNDLE, "FTL", build)  # type: ignore[no-any-return]

    def algorithm(self) -> Any:
        """The device's :class:`~privasr.federated.algorithms.ftl.FtlAlgorithm` (weights arrive with each
        round)."""
        from privasr.asr.models import AcousticConfig
        from privasr.federated.algorithms.ftl import FtlAlgorithm, FtlConfig

        s = self.bundle.settings
        return FtlAlgorithm(FtlConfig.from_dict(s["ftl"]), AcousticConfig.from_dict(s["model"]), self.tokenizer)

    def utterances(self, recordings: Sequence[Recording]) -> list[dict[str, Any]]:
        """One stored dict per recording (id, words, features); refuses words the units cannot spell.

        Raises:
            InputError: a transcript with a character outside the units (naming the utterance).
        """
        out = []
        for r in recordings:
            try:
                self.tokenizer.encode(r.words)
            except InputError as e:
                raise InputError(f"utterance {r.utt_id!r}: {e.message}", expected=e.expected) from None
            out.append({"utt_id": r.utt_id, "words": " ".join(r.words), "features": r.features})
        return out

    def client(self, name: str, groups: Sequence[Sequence[Mapping[str, Any]]]) -> Any:
        """The device's :class:`~privasr.federated.algorithms.ftl.FtlClient`: every utterance taken so far (CMVN
        over them, frame stacking, units)."""
        from privasr.asr.features import An4Utterance
        from privasr.asr.train import an4_examples
        from privasr.federated.algorithms.ftl import FtlClient

        utts = [An4Utterance(str(d["utt_id"]), name, tuple(str(d["words"]).split()),
                             np.asarray(d["features"], dtype=np.float32)) for g in groups for d in g]
        if not utts:
            raise InputError(f"device {name!r} has no utterances yet", expected="transcripts in its inbox")
        return FtlClient(name, tuple(an4_examples(utts, self.tokenizer, cmvn=self.cmvn)))
