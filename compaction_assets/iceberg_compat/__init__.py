"""Every pyiceberg private name the project uses, in one place.

pyiceberg 0.12 (pinned `>=0.12,<0.13` in pyproject.toml) has no public API for what compaction
commits and reads: a `replace` snapshot with Iceberg's RewriteFiles semantics, a manifest rewrite,
a delete-file append, format-version-3 manifests and manifest lists, a file's batches with its
deletes applied as a stream, and Arrow batches projected onto a schema by field id. The rest of the
package reaches those through the names defined here, never through a pyiceberg private name:

- `producers`: pyiceberg's snapshot producers with their private hooks (`_manifests`, `_summary`,
  `_commit`, ...) called under public names our producers override, and their private state read
  through properties;
- `manifest_writers`: the manifest and manifest-list writers' private hooks and state, the same way;
- `arrow`: the private functions and attributes of pyiceberg's Arrow IO and records.

tests/test_compat_contract.py checks the installed version against TESTED_PYICEBERG, that every
private name used here exists with the signature it was written against, that every hook mapped
here still exists on its pyiceberg base class, and that no producer of ours shadows a pyiceberg
name by accident. Upgrading pyiceberg means: run that test, fix what it names here, widen the pin.
The upstream proposal for a public `replace` producer (iceberg-python #3130 / PR #3131) would let
`producers.OverwriteProducer` go.
"""

TESTED_PYICEBERG = ("0.12",)  # minor versions this layer was written against and the contract test has seen
