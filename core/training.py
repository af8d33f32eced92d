"""``python -m core.training``: the training command line, kept at the path the docs give.

The code lives in :mod:`core.models.training`. Imported rather than run, this module stands aside
so that ``core.training`` and ``core.models.training`` are one module, not two copies.
"""
import sys

from core.models import training as _training

if __name__ == "__main__":
    sys.exit(_training.main())
sys.modules[__name__] = _training
