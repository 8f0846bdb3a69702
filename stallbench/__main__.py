"""``python -m stallbench``.

Python's ``-m`` puts the current directory *first* on ``sys.path``, so a stray ``signal.py``
or ``cython.py`` there would be imported by stallbench or by a library probing an optional
module. The entry is dropped before anything else is imported (unless ``-P`` already left it
out): a scenario's own ``"mytf:fn"`` is loaded by its file path instead (``registry.locate``).
The ``stallbench`` script's first entry is its own bin directory. docs/reliability.md: "Trust".
"""

import os
import sys

if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402 - after the path is safe

sys.exit(main())
