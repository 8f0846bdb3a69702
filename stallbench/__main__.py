"""``python -m stallbench``.

Python's ``-m`` puts the current directory *first* on ``sys.path``, so a stray ``signal.py``
or ``torch.py`` there would replace the real module for stallbench and every library it
imports. The directory moves to the *end* before anything else is imported: a scenario's own
``"mytf:fn"`` transform in it still imports, no installed module can be shadowed (the
``stallbench`` script gets the same order from ``cli.user_code_path``). docs/reliability.md: "Trust".
"""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    sys.path.append(sys.path.pop(0))

from .cli import main  # noqa: E402 - after the path is safe

sys.exit(main())
