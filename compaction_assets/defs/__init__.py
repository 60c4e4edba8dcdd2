"""The Dagster layer: thin glue from Dagster concepts onto the engine."""
