"""Build hook for the optional compiled n-gram query engine (everything else is in pyproject.toml).

``optional=True``: where no C compiler is available the install still succeeds and
:class:`privasr.lm.ngram.model.NgramModel` uses its numpy query path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("privasr.lm.ngram._engine", ["src/privasr/lm/ngram/_engine.c"],
                             extra_compile_args=["-O3"], optional=True)])
