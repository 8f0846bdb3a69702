"""stallbench results: the typed, versioned schema (``schema``), its JSON edge (``codec``),
migrations from older versions (``migrate``) and the files (``store``)."""

from .schema import *  # noqa: F401,F403 - the schema's classes are the package's API
from .schema import SCHEMA_VERSION, SUPPORTED_VERSIONS  # noqa: F401
from .store import (find, from_dict, load, newest_by_scenario, now_utc, result_stem,  # noqa: F401
                    save, to_dict, write_atomic)
