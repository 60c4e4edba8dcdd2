"""The code location: `dagster dev -w workspace.yaml` loads `defs` from here.

It reads compaction.yaml ($COMPACTION_CONFIG, else ./compaction.yaml) and makes one asset per
managed table; reload the code location to pick up tables created since. A run worker of the
run host defines only its run's tables ($COMPACTION_DEFS_TABLES), so a run's start does not
grow with the number of tables.
"""

import json
import os

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions
from compaction_assets.defs.naming import TABLES_ENV

_only = os.environ.get(TABLES_ENV)
defs = build_definitions(load_config(), only=json.loads(_only) if _only else None)
