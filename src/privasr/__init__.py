"""privasr: adapt speech recognition to its users without collecting their recordings or raw transcripts.

Devices send word counts or model updates instead, which still reveal words; docs/privacy.md says what each
algorithm and mode protects, and from whom.

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
