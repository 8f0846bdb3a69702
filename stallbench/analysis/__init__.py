"""Analysis: differential attribution, stage rates, the what-if models and their back-test.

Importing this package registers every what-if model (``whatif_models.MODELS``): the
one-point model lives in ``whatif``, the others in their own module, imported below.
"""

from . import contention  # noqa: F401 - registration (imports whatif, which registers one-point)
