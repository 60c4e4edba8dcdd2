"""The code location: `dagster dev -w workspace.yaml` loads `defs` from here.

It reads compaction.yaml ($COMPACTION_CONFIG, else ./compaction.yaml) and makes one asset per
managed table; reload the code location to pick up tables created since.
"""

from compaction_assets.config import load_config
from compaction_assets.defs.build import build_definitions

defs = build_definitions(load_config())
