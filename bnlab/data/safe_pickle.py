"""Restricted unpickling of the CIFAR "python version" batch files (see :mod:`bnlab.data.cifar`).

`RestrictedUnpickler` resolves only the globals the format needs (numpy's array reconstructor,
``ndarray``, ``dtype``, numpy scalars and ``_codecs.encode``, which protocol-2 pickles written by
Python 3 use for bytes) and refuses every other global — ``os.system``, ``subprocess.Popen``,
``builtins.eval``... — with `UnsafePickleError`, before it is called.
"""

from __future__ import annotations

import codecs
import io
import pickle

import numpy as np

from .base import DataError, UnsafePickleError

try:  # numpy >= 2 moved the implementation; old pickles still name numpy.core.multiarray.
    from numpy._core.multiarray import _reconstruct as _np_reconstruct
    from numpy._core.multiarray import scalar as _np_scalar
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct as _np_reconstruct
    from numpy.core.multiarray import scalar as _np_scalar


# (module, name) as the pickle spells it -> the object it may resolve to. Both spellings of numpy's
# core module are listed: the official files (Python 2, numpy 1) say numpy.core.multiarray, files
# written with numpy >= 2 say numpy._core.multiarray.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy.core.multiarray", "scalar"): _np_scalar,
    ("numpy._core.multiarray", "scalar"): _np_scalar,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """A `pickle.Unpickler` whose ``find_class`` admits only the globals of the CIFAR format.

    Anything else — in particular every callable that could run code (``os.system``, ``eval``,
    ``subprocess.Popen``, ``builtins.getattr``...) — raises `UnsafePickleError` naming the global,
    before it is called. Persistent ids are refused too.
    """

    source = "<bytes>"

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            allowed = ", ".join(f"{m}.{n}" for m, n in _ALLOWED_GLOBALS)
            raise UnsafePickleError(
                f"refusing to unpickle {self.source}: it asks for the global {module}.{name}, "
                f"which the CIFAR format never uses (allowed: {allowed}). The file is not a CIFAR "
                "batch and may be malicious; do not load it with the plain pickle module."
            ) from None

    def persistent_load(self, pid):
        raise UnsafePickleError(f"refusing to unpickle {self.source}: it uses persistent ids "
                                f"({pid!r})")


def restricted_loads(data: bytes, *, source: str = "<bytes>"):
    """Unpickle ``data`` (Python-2 str → bytes) with `RestrictedUnpickler`; clear errors on
    failure."""
    unpickler = RestrictedUnpickler(io.BytesIO(data), encoding="bytes")
    unpickler.source = source
    try:
        return unpickler.load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # truncated / garbage bytes raise many different types
        raise DataError(
            f"could not read {source}: not a valid pickle ({type(exc).__name__}: {exc}). The file "
            "is corrupt or truncated."
        ) from exc
