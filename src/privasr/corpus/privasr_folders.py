"""Folders privasr itself writes: a ``privasr data synth`` corpus and a ``privasr demo`` output folder.

A synthetic corpus (:meth:`privasr.synth.SynthCorpus.write`) is recognised by its ``manifest.json``
(``"generator": "privasr.synth"``, or ``"privasr.corpus.synth"`` as older versions wrote); its data sets are the files the manifest lists: the dev and test N-best
lists (``nbest/*.jsonl``), the reference transcripts with entity spans (``text/transcripts_*.jsonl``) and the
background text (``text/background.txt``). ``clients.json`` holds the generator's ground-truth client
profiles, not utterances, and is not a data set. A demo folder (``privasr demo``) is recognised by its
``results.json`` next to such a corpus in ``corpus/``; its data sets are the corpus's and the anonymised
transcripts in ``anon/`` (the model and checkpoint folders hold no corpus).

>>> import tempfile, pathlib
>>> from privasr.synth import SynthConfig, generate
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = generate(SynthConfig.preset("tiny", seed=1)).write(d)
>>> folder = privasr_folder(d)
>>> folder.kind, folder.description
('synth', 'a privasr data synth corpus (seed 1, 4 clients)')
>>> [(s.name, s.kind, s.fmt) for s in folder.load()]  # doctest: +NORMALIZE_WHITESPACE
[('nbest/dev', 'nbest', 'nbest-jsonl'), ('nbest/test', 'nbest', 'nbest-jsonl'),
 ('text/transcripts_dev', 'transcript', 'transcript-jsonl'),
 ('text/transcripts_test', 'transcript', 'transcript-jsonl'), ('text/background', 'transcript', 'text-lines')]
>>> privasr_folder(d / "nbest") is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privasr.corpus.formats._common import loads_json, natural_key
from privasr.corpus.load import Dataset, read_text_lines
from privasr.corpus.textio import PathLike, read_text
from privasr.errors import InputError

__all__ = ["PrivasrFolder", "privasr_folder", "SYNTH_FILES"]

SYNTH_FILES = {
    "nbest_dev": ("nbest-jsonl", "dev clients' N-best lists, with references"),
    "nbest_test": ("nbest-jsonl", "test clients' N-best lists, with references"),
    "transcripts_dev": ("transcript-jsonl", "dev clients' reference transcripts, with personal-entity spans"),
    "transcripts_test": ("transcript-jsonl", "test clients' reference transcripts, with personal-entity spans"),
    "background": ("text-lines", "background text (the server's LM training text)"),
}
"""The manifest's ``files`` entries that are data sets: key -> (format, what the set is)."""
_ANON = {"tag": "entities replaced by tags", "surrogate": "entities replaced by surrogates"}


_GENERATORS = ("privasr.synth", "privasr.corpus.synth")  # the second: manifests of privasr before 0.1.0's layout


@dataclass(frozen=True)
class PrivasrFolder:
    """A folder privasr wrote: ``kind`` is ``"synth"`` or ``"demo"``; ``files`` holds (set name, path, format,
    what the set is) per data set."""

    root: Path
    kind: str
    description: str
    files: tuple[tuple[str, Path, str, str], ...]

    def load(self) -> list[Dataset]:
        """The folder's data sets, named by their path under the folder without the suffix."""
        from privasr.corpus.formats.nbest_jsonl import read_nbest, read_transcripts

        readers = {"nbest-jsonl": read_nbest, "transcript-jsonl": read_transcripts, "text-lines": read_text_lines}
        kinds = {"nbest-jsonl": "nbest", "transcript-jsonl": "transcript", "text-lines": "transcript"}
        out = []
        for name, path, fmt, _ in self.files:
            if not path.is_file():
                raise InputError(f"the {self.kind} folder's file {path.relative_to(self.root)} is missing", path=path,
                                 expected="the files its manifest.json lists")
            out.append(Dataset(name, kinds[fmt], fmt, tuple(readers[fmt](path))))
        return out

    def summary(self) -> dict[str, Any]:
        """What the folder is, for ``privasr data inspect --json``."""
        return {"kind": self.kind, "description": self.description,
                "files": {name: {"path": str(path.relative_to(self.root)), "what": what}
                          for name, path, _, what in self.files}}


def _manifest(folder: Path) -> dict[str, Any] | None:
    p = folder / "manifest.json"
    if not p.is_file():
        return None
    try:
        m = loads_json(read_text(p))
    except InputError:
        return None
    return m if isinstance(m, dict) and m.get("generator") in _GENERATORS else None


def _set_name(rel: Path) -> str:
    name = rel.as_posix()
    for suf in (".jsonl", ".txt"):
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def _synth_files(root: Path, corpus: Path, manifest: dict[str, Any]) -> list[tuple[str, Path, str, str]]:
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise InputError("manifest.json has no 'files' object", path=corpus / "manifest.json",
                         expected="the manifest privasr data synth writes")
    out = []
    for key, (fmt, what) in SYNTH_FILES.items():
        rel = listed.get(key)
        if isinstance(rel, str):
            path = corpus / rel
            out.append((_set_name(path.relative_to(root)), path, fmt, what))
    return out


def privasr_folder(path: PathLike) -> PrivasrFolder | None:
    """The synth corpus or demo output folder at ``path``, or ``None`` when it is neither (see the module doc)."""
    root = Path(path)
    if not root.is_dir():
        return None
    m = _manifest(root)
    if m is not None:
        config = m.get("config") if isinstance(m.get("config"), dict) else {}
        desc = f"a privasr data synth corpus (seed {m.get('seed')}, {config.get('num_clients', '?')} clients)"
        return PrivasrFolder(root, "synth", desc, tuple(_synth_files(root, root, m)))
    m = _manifest(root / "corpus")
    if m is None or not (root / "results.json").is_file():
        return None
    files = _synth_files(root, root / "corpus", m)
    anon = root / "anon"
    if anon.is_dir():
        for q in sorted(anon.glob("*.jsonl"), key=lambda q: natural_key(q.name)):
            stem = q.name[: -len(".jsonl")]
            split = "test" if "test" in stem else "dev" if "dev" in stem else "the"
            how = _ANON.get(stem.rpartition(".")[2], "anonymised")
            files.append((_set_name(q.relative_to(root)), q, "transcript-jsonl",
                          f"{split} clients' transcripts, {how} (privasr anonymize)"))
    desc = (f"a privasr demo output folder (corpus/: seed {m.get('seed')}; results.json and report.md; "
            f"model folders not read)")
    return PrivasrFolder(root, "demo", desc, tuple(files))
