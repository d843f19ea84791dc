"""privasr: adapt speech recognition to its users without collecting their speech or text.

>>> import privasr
>>> isinstance(privasr.__version__, str)
True
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("privasr")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
