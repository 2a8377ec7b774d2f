"""One registration per family: a config section names its class once, and one helper builds it.

Two config sections are families whose ``kind`` picks the dataclass: ``model.decoder`` (the decoder families,
``models/decoders/``) and ``train.objective`` (the training objectives, ``objective_sections.py``). Each family is
one ``Family`` table, kind -> its torch-free section dataclass, and each dataclass names the class it configures
once, as a lazy ``"module:Class"`` path (its ``IMPLEMENTATION``). So reading a config imports neither torch nor the
class's wing (``config.py`` reads the tables), and building a section imports only the class it names
(``build``). Adding a decoder family or an objective is its section, its module, and one line in its family's
table; ``tests/test_layering.py`` reads the paths as imports (of the builder's wing) and checks their floors.

The reading of those sections is here too (``TaggedSections``: a config's nested dataclasses from a mapping and
from ``key.path=value`` overrides, a kinded section's dataclass the one its ``kind`` names), so a third kinded
family is one more ``Family`` given to config.py's reader, with no new reading code. So are the lighter tables of
named things (``Registry``: scorers, attention reads, data formats), each name a lazy path.

Torch-free; imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any, Generic, Iterator, TypeVar

import yaml

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


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file, key or value (config.py and config_files.py
    raise it)."""


class TaggedSections:
    """Nested config dataclasses (under ``root``) read from mappings and ``key.path=value`` overrides, where a
    kinded section's dataclass is the one its ``kind`` names in its ``Family`` (``kinded``: base class -> family;
    a tagged union: ``model.decoder``, ``train.objective``). Types are checked as read (ints where floats are
    expected), unknown keys name the valid ones. A kind changed by override starts its section afresh, that kind's
    defaults, as a config file's kind change does (config_files.py), except in the ``reinterpreted`` sections,
    which keep the keys the new kind reads in one sense and refuse those it reads in another (unless the section
    is set whole). config.py builds one."""

    def __init__(self, root: type, kinded: dict[type, Family], reinterpreted: tuple[str, ...] = ()) -> None:
        self.root, self.kinded, self.reinterpreted = root, dict(kinded), reinterpreted

    # ------------------------------------------------------------------ reading a mapping

    @staticmethod
    def field_types(cls: type) -> dict[str, Any]:
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    @staticmethod
    def coerce(value: Any, typ: Any, path: str) -> Any:
        """Check ``value`` against the annotated type; ints are accepted where floats are expected."""
        if typ is bool:
            if isinstance(value, bool):
                return value
        elif typ is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif typ is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
                try:
                    return float(value)
                except ValueError:
                    pass
        elif typ is str:
            if isinstance(value, str):
                return value
        else:  # pragma: no cover - only the four scalar types are used
            raise ConfigError(f"{path}: unsupported field type {typ}")
        name = getattr(typ, "__name__", str(typ))
        raise ConfigError(f"{path}: expected {name}, got {type(value).__name__} {value!r}")

    def section_class(self, cls: type, kind: Any) -> type:
        """The dataclass of a section: itself, or for a kinded one the one ``kind`` names."""
        if cls not in self.kinded:
            return cls
        try:
            return self.kinded[cls].section(kind)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def kinded_defaults(self) -> dict[str, str]:
        """The kinded sections' key paths -> their default kind (what a merge of config files must know)."""
        return {family.where: family.default for family in self.kinded.values()}

    def kinded_section(self, where: str, kind: Any) -> type:
        """The dataclass of the kinded section at ``where`` for ``kind``; ConfigError naming the valid kinds."""
        base = next(base for base, family in self.kinded.items() if family.where == where)
        return self.section_class(base, kind)

    def _where(self, cls: type, prefix: str) -> str:
        """How an unknown key's message names the section it is not in."""
        if issubclass(cls, tuple(self.kinded)):
            return f"{prefix} for kind {cls.kind}"
        return prefix or "top level"

    def from_dict(self, cls: type, data: Any, prefix: str = "") -> Any:
        """An instance of ``cls`` (a kinded section: of the kind ``data`` names) from a nested mapping."""
        if not isinstance(data, dict):
            raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
        cls = self.section_class(cls, data.get("kind", self.kinded[cls].default) if cls in self.kinded else None)
        types_ = self.field_types(cls)
        unknown = sorted(set(data) - set(types_))
        if unknown:
            # a file's section of one kind, its kind changed by --set: its keys are the other kind's
            hint = (f"; to change a section's kind, set it whole: --set '{prefix}={{kind: {cls.kind}, ...}}'"
                    if issubclass(cls, tuple(self.kinded)) else "")
            raise ConfigError(f"unknown config key {'.'.join(filter(None, [prefix, str(unknown[0])]))!r} "
                              f"(valid keys at {self._where(cls, prefix)}: {', '.join(types_)}){hint}")
        kwargs = {}
        for name, typ in types_.items():
            if name in data:
                path = f"{prefix}.{name}" if prefix else name
                kwargs[name] = (self.from_dict(typ, data[name], path) if dataclasses.is_dataclass(typ)
                                else self.coerce(data[name], typ, path))
        return cls(**kwargs)

    # ------------------------------------------------------------------ overrides

    @staticmethod
    def split_override(text: str) -> tuple[list[str], str]:
        """Split ``a.b.c=value`` into its key path and the raw value text."""
        if "=" not in text:
            raise ConfigError(f"override {text!r} must look like key.path=value")
        key, raw = text.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        if not key or any(not p for p in parts):
            raise ConfigError(f"override {text!r}: empty key path")
        return parts, raw

    @staticmethod
    def parse_value(raw: str, typ: Any, path: str) -> Any:
        """Read an override's text as the field's type: text stays text, numbers are numbers."""
        if typ is str:
            return raw
        if dataclasses.is_dataclass(typ):
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as err:
                raise ConfigError(f"{path}: cannot parse {raw!r} ({err})") from None
        text = raw.strip()
        if typ is bool:
            lowered = text.lower()
            if lowered in ("true", "yes", "on", "1"):
                return True
            if lowered in ("false", "no", "off", "0"):
                return False
            raise ConfigError(f"{path}: expected bool (true/false), got {raw!r}")
        for number in (int, float):
            if typ is number:
                try:
                    return number(text)
                except ValueError:
                    raise ConfigError(f"{path}: expected {number.__name__}, got {raw!r}") from None
        raise ConfigError(f"{path}: unsupported field type {typ}")  # pragma: no cover

    def parse_override(self, text: str, kinds: dict[str, Any] | None = None) -> tuple[list[str], Any]:
        """Split ``a.b.c=value`` into its key path and the value read as that field's type (a kinded section's
        keys are those of the kind ``kinds`` gives it, keyed by its path; the default kind where it names none)."""
        parts, raw = self.split_override(text)
        return parts, self.parse_value(raw, self.field_type_at(parts, kinds or {}), ".".join(parts))

    def field_type_at(self, parts: list[str], kinds: dict[str, Any]) -> Any:
        """The annotated type at a key path; unknown keys name the valid ones."""
        cls: Any = self.root
        typ: Any = self.root
        for i, part in enumerate(parts):
            if not dataclasses.is_dataclass(cls):
                raise ConfigError(f"{'.'.join(parts[:i])} is a value, not a section")
            cls = self._kinded_class(cls, kinds, ".".join(parts[:i]))
            types_ = self.field_types(cls)
            if part not in types_:
                raise ConfigError(f"unknown config key {'.'.join(parts[: i + 1])!r} "
                                  f"(valid keys at {self._where(cls, '.'.join(parts[:i]))}: {', '.join(types_)})")
            typ = cls = types_[part]
        return typ

    def _kinded_class(self, cls: type, kinds: dict[str, Any], path: str) -> type:
        """The dataclass of the section at ``path``: for a kinded one, that of the kind ``kinds`` names there."""
        return self.section_class(cls, kinds.get(path, self.kinded[cls].default) if cls in self.kinded else None)

    def kinds_of(self, data: dict) -> dict[str, Any]:
        """The kinds a nested dict names for its kinded sections (path -> its kind; absent: the default)."""
        kinds = {}
        for family in self.kinded.values():
            node: Any = data
            for part in family.where.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and "kind" in node:
                kinds[family.where] = node["kind"]
        return kinds

    def sets_a_kind(self, text: str) -> bool:
        """Whether an override sets a kinded section's kind (applied first: the section's other keys are its)."""
        return ".".join(self.split_override(text)[0]) in {f"{f.where}.kind" for f in self.kinded.values()}

    def _kind_change(self, data: dict, parts: list[str], value: Any) -> tuple[Family, dict] | None:
        """(the family, the section's mapping in ``data``) when an override (``parts`` = value) changes the kind of
        a kinded section the file sets; None for any other override."""
        where = ".".join(parts[:-1])
        family = next((f for f in self.kinded.values() if f.where == where), None)
        if family is None or parts[-1] != "kind":
            return None
        node: Any = data
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or node.get("kind", family.default) == value:
            return None
        return family, node

    def resets(self, data: dict, text: str) -> str | None:
        """The section a ``key.path=value`` override starts afresh in ``data`` (a kind change of a kinded section
        that is not ``reinterpreted``: its keys were the old kind's), or None."""
        parts, value = self.parse_override(text, self.kinds_of(data))
        change = self._kind_change(data, parts, value)
        where = ".".join(parts[:-1])
        return where if change is not None and where not in self.reinterpreted else None

    def _refuse_reinterpreted_keys(self, data: dict, parts: list[str], value: Any) -> None:
        """A --set of a ``reinterpreted`` section's kind refuses the file's keys that the new kind reads in another
        sense (loo's ``samples``, K paths per caption, is not SCST's captions per image); keys declared by a class
        both kinds share (``alpha_c`` from xe to loo) stay. Keys the new kind lacks: ``from_dict`` refuses them
        as unknown, with that advice."""
        where = ".".join(parts[:-1])
        change = self._kind_change(data, parts, value)
        if change is None or where not in self.reinterpreted:
            return
        family, node = change
        old_kind = node.get("kind", family.default)
        old, new = family.section(old_kind), family.section(value)
        differ = [k for k in node if k != "kind" and _declared_by(new, k) is not None
                  and _declared_by(new, k) is not _declared_by(old, k)]
        if differ:
            keys = ", ".join(f"{where}.{k}" for k in differ)
            raise ConfigError(f"{keys}: set for kind {old_kind!r}, which kind {value!r} reads in another sense; to "
                              f"change a section's kind, set it whole: --set '{where}={{kind: {value}, ...}}'")

    def apply_override(self, data: dict, text: str) -> None:
        """Set one ``key.path=value`` override into a nested dict, checking the path exists (a kinded section's
        keys: those of the kind the dict names there). A kind change starts the section afresh (``resets``), as
        a config file's does: `--set model.decoder.kind=transformer` over an LSTM section kept its feature_dropout,
        and its hidden_dim, the LSTM's size, became the feed-forward width; in a ``reinterpreted`` section, the
        keys the new kind reads in another sense are refused instead (``_refuse_reinterpreted_keys``)."""
        kinds = self.kinds_of(data)
        parts, value = self.parse_override(text, kinds)
        if parts[-1] == "kind":
            try:
                self._refuse_reinterpreted_keys(data, parts, value)
            except ConfigError:
                raise
            except ValueError:  # an unknown kind: the section lookup below names the valid ones
                pass
            if self.resets(data, text):
                self._kind_change(data, parts, value)[1].clear()  # the new kind's keys follow (kinds first)
                kinds = self.kinds_of(data)
        path = ".".join(parts)
        typ = self.field_type_at(parts, kinds)
        if dataclasses.is_dataclass(typ) and not isinstance(value, dict):
            raise ConfigError(f"{path} is a section; set one of its keys: "
                              f"{', '.join(self.field_types(self._kinded_class(typ, kinds, path)))}")
        node = data
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{'.'.join(parts[: i + 1])}: expected a mapping in the config file")
        node[parts[-1]] = value


def _declared_by(cls: type, key: str) -> type | None:
    """The class in ``cls``'s hierarchy that declares field ``key`` (None: ``cls`` has no such field)."""
    return next((c for c in cls.__mro__ if key in c.__dict__.get("__annotations__", {})), None)
