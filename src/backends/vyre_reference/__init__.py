"""The numpy reference engine: the exact oracle of the Program IR semantics."""

__all__: list[str] = []
