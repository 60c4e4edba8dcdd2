"""The Python daemon of a local Spark session (`spark.python.daemon.module`): pyspark's own daemon,
whose forked workers never import pandas.

Nothing a worker runs uses pandas (groups arrive and leave as Arrow batches, Polars and pyarrow
rewrite them), yet pyarrow imports it the first time it asks whether a value is a pandas object
(its pandas shim, on `import pyarrow.dataset`, which pyiceberg's Arrow IO imports): 52 MiB resident
in every worker, two workers on two cores. pyarrow needs pandas for one thing a worker could
meet: a nanosecond timestamp as a Python value (pd.Timestamp). So no worker asks for one: the
Arrow path's statistics read nanosecond bounds as integers (parquet_encoding.file_statistics), an
old-spec split its partition values (partitioning); tests/test_spark_workers.py runs both in a
worker. Here `import pandas` fails as if pandas were not
installed, so pyarrow's shim records that it has none; Polars finds a spec and only imports pandas
for a pandas object, which no worker holds. Only the workers of the local session the engine
starts use this daemon (`spark.spark_conf`); anything in compaction.yaml's spark.conf wins.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

from pyspark import daemon

LEFT_OUT = "pandas"


class LeaveOut(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `import <name>` (and its submodules) raise ModuleNotFoundError."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:  # noqa: ANN001
        if fullname == self.name or fullname.startswith(f"{self.name}."):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        raise ModuleNotFoundError(f"{spec.name} is left out of compaction workers", name=spec.name)

    def exec_module(self, module: ModuleType) -> None:  # never reached: create_module raises
        raise ModuleNotFoundError(module.__name__, name=module.__name__)


if __name__ == "__main__":
    sys.meta_path.insert(0, LeaveOut(LEFT_OUT))
    daemon.manager()
