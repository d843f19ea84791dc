"""Acoustic side of privasr (paper 002, the ``asr`` extra): features, output units, first-pass decoding.

Submodules are imported on demand (they need the ``asr`` extra: kaldi-native-fbank, sentencepiece,
pocketsphinx, soundfile).
"""
