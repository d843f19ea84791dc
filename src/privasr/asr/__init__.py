"""Acoustic side of privasr (paper 002, the ``asr`` extra): features, output units, first-pass decoding,
acoustic models, search and training helpers.

Submodules are imported on demand (they need the ``asr`` extra: kaldi-native-fbank, sentencepiece,
pocketsphinx, soundfile; ``models``, ``search`` and ``train`` also need torch, the ``neural`` extra), so
importing :mod:`privasr.asr` itself loads none of them.
"""
