"""The conformance corpus ships with the package: `vyre_async.testing.corpus` (re-exported here)."""

from vyre_async.testing.corpus import SEMANTIC_RULES, Case, cases

__all__ = ["SEMANTIC_RULES", "Case", "cases"]
