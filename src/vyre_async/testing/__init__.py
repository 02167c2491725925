"""The driver contract suite and conformance corpus, shipped for any backend's author.

    python -m pytest --pyargs vyre_async.testing --vyre-backend=ID

runs every contract test (`vyre_async.testing.test_contract`) and the whole
conformance corpus (`vyre_async.testing.corpus`) against the backend ``ID``,
under asyncio and trio. ``ID`` is a registered backend id, or
``package.module:NAME`` naming a `vyre_async.BackendRegistration` to register
first (for a backend without an entry point). The pytest plugin
(`vyre_async.testing.plugin`, entry point ``pytest11``) adds the option and the
``vyre_backend`` fixture; it needs pytest, anyio's pytest plugin (installed
with anyio) and, for the trio half, trio. See ``docs/backend-authors.md``.
"""

from vyre_async._exports import public_dir as _public_dir

__all__: list[str] = []  # the suite lives in its submodules: corpus, plugin, test_contract
__dir__ = _public_dir(__name__)
