"""The value classes: frozen, equal and hashed by value, as the dataclasses they replaced."""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import msgspec
import pytest

import rallypoint
from rallypoint.model import ClusterDoc, Member
from rallypoint.settings import Settings

#: Every module of the package, wherever it lives: a new module is checked without a list.
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(rallypoint.__path__, "rallypoint.")
    if not info.name.startswith("rallypoint.__main__")
)
#: Changed in place, only through its PeerTable.
MUTABLE = {"PeerState"}


def _value_classes() -> list[type[msgspec.Struct]]:
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        found += [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, msgspec.Struct)
            and obj.__module__ == module.__name__
        ]
    return found


def test_every_value_class_but_the_peer_state_is_frozen() -> None:
    classes = _value_classes()
    assert len(classes) >= 26
    assert {c.__name__ for c in classes if not c.__struct_config__.frozen} == MUTABLE


def test_a_frozen_value_refuses_changes_with_attribute_error() -> None:
    member = Member(1, "b", ("10.0.0.2",))
    with pytest.raises(AttributeError):
        member.host = "c"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del member.host  # type: ignore[misc]
    assert member.host == "b"


def test_values_compare_and_hash_by_their_fields() -> None:
    doc = ClusterDoc("s", "g1", "a", 29500, (Member(0, "a", ("10.0.0.1",)),))
    same = ClusterDoc("s", "g1", "a", 29500, (Member(0, "a", ("10.0.0.1",)),))
    other = msgspec.structs.replace(doc, generation="g2")
    assert doc == same and hash(doc) == hash(same) and len({doc, same, other}) == 2
    assert doc != other and other.generation == "g2" and doc.generation == "g1"
    assert pickle.loads(pickle.dumps(doc)) == doc


def test_settings_repr_names_every_field_but_the_token() -> None:
    text = repr(Settings(token="s3cret", verbose=True))
    assert "s3cret" not in text and "token" not in text
    assert text.startswith("Settings(provider=None, local_hosts=") and "verbose=True" in text
    shown = text.count("=") - text.count("==")
    assert shown == len(Settings.__struct_fields__) - 1
