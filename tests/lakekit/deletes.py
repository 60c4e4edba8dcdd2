"""Delete files written and committed as another engine would: the product's writer (lake.delete_files),
which tests/test_lakekit.py checks against DuckDB's and the spec reader's reading of them."""

from compaction_assets.lake.delete_files import (  # noqa: F401 (re-exported)
    commit_delete_files,
    equality_delete_file,
    position_delete_file,
    read_column,
)
