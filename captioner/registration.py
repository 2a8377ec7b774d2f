"""One registration per family: a config section names its class once, and one helper builds it.

Two config sections are families whose ``kind`` picks the dataclass: ``model.decoder`` (the decoder families,
``models/decoders/``) and ``train.objective`` (the training objectives, ``objective_sections.py``). Each family is
one ``Family`` table, kind -> its torch-free section dataclass, and each dataclass names the class it configures
once, as a lazy ``"module:Class"`` path (its ``IMPLEMENTATION``). So reading a config imports neither torch nor the
class's wing (``config.py`` reads the tables), and building a section imports only the class it names
(``build``). Adding a decoder family or an objective is its section, its module, and one line in its family's
table; ``tests/test_layering.py`` reads the paths as imports (of the builder's wing) and checks their floors.

Torch-free; imports nothing of the package.
"""

from __future__ import annotations

import importlib
from typing import Any, Generic, Iterator, TypeVar

S = TypeVar("S")


class Family(Generic[S]):
    """The sections of one family, by kind: ``where`` is the section's key path (``"train.objective"``),
    ``default`` the kind a config without one gets, ``sections`` kind -> dataclass (each with that kind as its
    ``kind`` default and an ``IMPLEMENTATION`` path)."""

    def __init__(self, where: str, default: str, sections: dict[str, type[S]]) -> None:
        if default not in sections:
            raise ValueError(f"{where}: the default kind {default!r} is not one of {', '.join(sections)}")
        self.where, self.default, self.sections = where, default, dict(sections)

    def section(self, kind: Any) -> type[S]:
        """The dataclass of ``kind`` (ValueError naming the valid kinds, for any other value)."""
        if not isinstance(kind, str) or kind not in self.sections:
            raise ValueError(f"{self.where}.kind: {kind!r} is not one of {', '.join(self.sections)}")
        return self.sections[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self.sections)

    def __contains__(self, kind: object) -> bool:
        return kind in self.sections

    def items(self):
        return self.sections.items()


def implementation(section: Any, of: type | None = None) -> type:
    """The class a section (an instance or its dataclass) names in ``IMPLEMENTATION`` (``"module:Class"``),
    imported now; an ImportError naming the section and the path when it does not resolve, a TypeError when it
    is not a subclass of ``of`` (when given)."""
    cls = section if isinstance(section, type) else type(section)
    path = getattr(cls, "IMPLEMENTATION", "")
    module, _, name = path.partition(":")
    if not module or not name:
        raise ImportError(f"{cls.__name__} names no class: its IMPLEMENTATION is {path!r}, not 'module:Class'")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"{cls.__name__}.IMPLEMENTATION {path!r} does not resolve: {err}") from err
    if of is not None and not (isinstance(found, type) and issubclass(found, of)):
        raise TypeError(f"{cls.__name__}.IMPLEMENTATION {path!r} is not a subclass of {of.__name__}")
    return found


def build(section: Any, *args: Any, of: type | None = None, **kwargs: Any) -> Any:
    """An instance of the class ``section`` names (a subclass of ``of``, when given), built with ``args`` and
    ``kwargs``: what builds a decoder (models/decoders/registry.py) and an objective (training/objectives/
    registry.py)."""
    return implementation(section, of)(*args, **kwargs)


class Registry:
    """The named things of one kind that a config picks by name without a section of their own: scorers
    (``model.attention.scorer``), attention reads (``model.attention.attention``), data formats (``data.format``),
    grounding sources. Each name maps to a lazy ``"module:attr"`` path, so the names are known torch-free (the
    config checks a choice against them) and the thing is imported only when used (``get``). Adding one is its
    code and one line in its table (``captioner/names.py``)."""

    def __init__(self, where: str, paths: dict[str, str]) -> None:
        self.where, self.paths = where, dict(paths)

    def get(self, name: Any) -> Any:
        """The thing ``name`` names, imported now; ValueError naming the valid names for any other value, an
        ImportError naming the path when it does not resolve."""
        if not isinstance(name, str) or name not in self.paths:
            raise ValueError(f"{self.where}: {name!r} is not one of {', '.join(self.paths)}")
        module, _, attr = self.paths[name].partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ImportError(f"{self.where} {name!r}: {self.paths[name]!r} does not resolve: {err}") from err

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __contains__(self, name: object) -> bool:
        return name in self.paths

    def __len__(self) -> int:
        return len(self.paths)
