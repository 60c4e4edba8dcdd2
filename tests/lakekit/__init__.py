"""Test helpers that act as other engines on a real table: write delete files (pyiceberg 0.12 cannot),
read the table with an independent Iceberg implementation (DuckDB), and model its rows (an oracle)."""
