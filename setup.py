"""Build hook for the optional compiled modules (everything else is in pyproject.toml): the n-gram query engine,
the neural trainer's dropout masks and its output layer's softmax cross-entropy rows, and the neural scorer's
prefix tries and Transformer row packing, and sclite's network alignment.

``optional=True``: where no C compiler is available the install still succeeds;
:class:`privasr.lm.ngram.model.NgramModel` then uses its numpy query path and
:mod:`privasr.lm.neural.dropout` torch's own dropout, the trainer's output layer torch's operations, and
:mod:`privasr.lm.neural.trie` its Python and numpy loops, :mod:`privasr.metrics.sclite` its Python DP.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("privasr.lm.ngram._engine", ["src/privasr/lm/ngram/_engine.c"], extra_compile_args=["-O3"],
              optional=True),
    Extension("privasr.lm.neural._dropout", ["src/privasr/lm/neural/_dropout.c"], extra_compile_args=["-O3"],
              optional=True),
    Extension("privasr.lm.neural._trie", ["src/privasr/lm/neural/_trie.c"], extra_compile_args=["-O3"],
              optional=True),
    Extension("privasr.metrics._netdp", ["src/privasr/metrics/_netdp.c"], extra_compile_args=["-O3"], optional=True),
    Extension("privasr.lm.neural._nll", ["src/privasr/lm/neural/_nll.c"], extra_compile_args=["-O3", "-fopenmp"],
              extra_link_args=["-fopenmp"], optional=True),
])
