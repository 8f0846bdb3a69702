"""stallbench results: the typed, versioned schema (``schema``), its JSON edge (``codec``),
migrations from older versions (``migrate``) and the files (``store``)."""

from .schema import *  # noqa: F401,F403 - the schema's classes are the package's API
from .schema import SCHEMA_VERSION, SUPPORTED_VERSIONS  # noqa: F401
from .store import (find, from_dict, load, load_tune, newest_by_scenario, now_utc,  # noqa: F401
                    result_stem, save, save_tune, to_dict, write_atomic)
