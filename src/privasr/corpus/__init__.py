"""Corpus records, readers and writers, partitioning, and the synthetic demo corpus."""

from privasr.corpus.records import Client, Hypothesis, NBest, Population, Span, Transcript, Utterance
from privasr.corpus.references import attach_references

__all__ = ["Client", "Hypothesis", "NBest", "Population", "Span", "Transcript", "Utterance", "attach_references"]
