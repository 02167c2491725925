"""The driver contract on every registered backend, through the shipped suite.

The tests live in the package (`vyre_async.testing.test_contract`) so that a
third-party backend runs them with ``python -m pytest --pyargs vyre_async.testing
--vyre-backend=ID``; here they run through the same plugin (`vyre_async.testing.plugin`),
on every registered dispatching backend (a backend that cannot start here is
skipped with its reason; a skip is never counted as a pass).
"""

from vyre_async.testing.test_contract import *  # noqa: F403 - the suite, as shipped
