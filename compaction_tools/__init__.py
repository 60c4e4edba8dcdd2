"""Tools beside the product, not part of it: the bench, the demo, the soak drill and the local
servers they and the tests start (S3 on moto, a Spark standalone cluster). They use the product
(`compaction_assets`); the product never imports them. Their commands join the product's CLI
through the `compaction_assets.commands` entry points (compaction_tools/cli.py)."""
