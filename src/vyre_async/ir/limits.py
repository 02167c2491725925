"""Structural limits shared by the validator and the wire decoder."""

from __future__ import annotations

from vyre_async._exports import public_dir as _public_dir

__all__ = [
    "MAX_BUFFERS",
    "MAX_BUFFER_ELEMENTS",
    "MAX_EXPR_DEPTH",
    "MAX_NAME_BYTES",
    "MAX_NODES",
    "MAX_STMT_DEPTH",
    "MAX_WORKGROUP_BYTES",
    "MAX_WORKGROUP_LANES",
]
__dir__ = _public_dir(__name__)

#: Deepest statement nesting (If/Loop/Block inside each other).
MAX_STMT_DEPTH = 64
#: Deepest expression tree.
MAX_EXPR_DEPTH = 128
#: Most statement + expression nodes in one program.
MAX_NODES = 100_000
#: Most elements of one buffer (indices and `BufLen` are u32).
MAX_BUFFER_ELEMENTS = 0xFFFF_FFFF
#: Most buffers in one program.
MAX_BUFFERS = 256
#: Longest buffer, variable or op-id name, in UTF-8 bytes.
MAX_NAME_BYTES = 256
#: Largest product of the workgroup axes.
MAX_WORKGROUP_LANES = 1024
#: Largest total size of a program's WORKGROUP buffers.
MAX_WORKGROUP_BYTES = 48 * 1024
