"""What the generated suites share: seeded randomness, split-disjoint vocabularies, knobs.

Every name pool is cut in two by position, even items for `train` and odd for `heldout`, and
every generated entity name contains at least one split-owned part; so the two splits can
never share an entity, a file's content or a bug site, whatever the seed. Names are invented
(`Varholt`, `Brennport`) so that a model cannot answer from memory: it has to use the tools.

The generator is public code, so a seed alone would let the model's own code regenerate its
task and read the answer (`load_tasks("builtin:data")` inside the sandbox). Every stream is
therefore also keyed by a secret the sandbox cannot read (`suite_key`): the same key gives the
same tasks on any machine; `TOOLSELF_SUITE_KEY=public` gives the unkeyed tasks of earlier
toolself versions, which anyone can regenerate.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import secrets
from pathlib import Path
from typing import Any, Sequence, TypeVar

SPLITS = ("train", "heldout")
DEFAULT_SIZES = {"train": 200, "heldout": 100}

T = TypeVar("T")


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the built-in suites have {list(SPLITS)}")
    return split


PUBLIC_KEY = "public"
KEY_VARIABLE = "TOOLSELF_SUITE_KEY"


def key_file() -> Path:
    base = os.environ.get("TOOLSELF_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "toolself") / "suite.key"


def suite_key() -> str:
    """The secret that keys generation: TOOLSELF_SUITE_KEY when set (to share a task set between
    machines), else this user's key file, made on first use with mode 0600 in a 0700 folder.
    The sandbox neither inherits the variable nor can read the file when tools run as their own
    uid (the host is root); when they run as the host's own user it can (docs/security.md)."""
    given = os.environ.get(KEY_VARIABLE, "").strip()
    if given:
        return given
    path = key_file()
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        pass
    temporary = path.with_name(f".suite.key.{secrets.token_hex(6)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise RuntimeError(f"cannot make the built-in suites' key {path} ({exc.strerror}): set {KEY_VARIABLE} "
                           "or TOOLSELF_CACHE to a folder you can write") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    try:
        os.link(temporary, path)  # atomic, and never over a key another process made first
    except FileExistsError:
        pass
    finally:
        temporary.unlink()
    return path.read_text(encoding="utf-8").strip()


def suite_key_id(key: str | None = None) -> str:
    """A short public name for a key, for saying which task set a result was measured on."""
    key = suite_key() if key is None else key
    return PUBLIC_KEY if key == PUBLIC_KEY else hashlib.sha256(key.encode()).hexdigest()[:12]


def rng_for(suite: str, split: str, seed: int, *extra: Any) -> random.Random:
    """A generator seeded by (key, suite, split, seed, ...): string seeds hash with SHA-512 in
    Python's `random`, so the stream is the same on every machine and run for the same key."""
    key = suite_key()
    parts = (suite, split, seed, *extra) if key == PUBLIC_KEY else (key, suite, split, seed, *extra)
    return random.Random(":".join(str(p) for p in parts))


def split_part(items: Sequence[T], split: str) -> list[T]:
    offset = SPLITS.index(check_split(split))
    return list(items[offset::2])


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def knob_int(knobs: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = knobs.pop(name, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"knob {name}={value!r} must be an integer") from None
    if not low <= number <= high:
        raise ValueError(f"knob {name}={number} must be between {low} and {high}")
    return number


def knob_range(knobs: dict[str, Any], name: str, default: tuple[int, int], low: int, high: int) -> tuple[int, int]:
    """`hops=3` or `hops=2-4`."""
    value = knobs.pop(name, None)
    if value is None:
        return default
    text = str(value)
    first, _, last = text.partition("-")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise ValueError(f"knob {name}={text!r} must be N or N-M") from None
    if not (low <= a <= b <= high):
        raise ValueError(f"knob {name}={text!r} must lie within {low}-{high}")
    return a, b


def reject_unknown(suite: str, knobs: dict[str, Any]) -> None:
    if knobs:
        raise ValueError(f"builtin:{suite} has no knob(s) {sorted(knobs)}")


GIVEN_NAMES = [
    "Elena", "Marcus", "Ada", "Tomas", "Ines", "Oskar", "Lena", "Felix", "Mira", "Jonas", "Clara", "Anton",
    "Nadia", "Victor", "Rosa", "Emil", "Greta", "Hugo", "Alma", "Leon", "Ivy", "Paul", "Nora", "Otto",
    "Sara", "Karl", "Vera", "Ruben", "Lise", "Arne", "Edith", "Mateo", "Hanna", "Theo", "Julia", "Bruno",
]

SURNAME_HEADS = [
    "Var", "Kel", "Mor", "Ast", "Bel", "Cor", "Dun", "Eld", "Fen", "Gar", "Hal", "Ist", "Jor", "Kas", "Lun",
    "Mer", "Nor", "Ost", "Pel", "Quin", "Ros", "Sel", "Tor", "Ulm", "Ven", "Wyn", "Yar", "Zel", "Bran", "Cald",
    "Dra", "Falk", "Grim", "Hol", "Ivar", "Kal", "Lor", "Mal", "Nev", "Orm",
]
SURNAME_TAILS = ["holt", "mere", "wick", "den", "ling", "ford", "ster", "by", "more", "ton", "ridge", "wood",
                 "dale", "croft", "ham", "ley", "win", "worth", "gate", "field"]

PLACE_HEADS = [
    "Bren", "Cas", "Dor", "Esk", "Fal", "Glen", "Hart", "Ilm", "Kir", "Lind", "Marn", "Nest", "Orr", "Pren",
    "Rav", "Stav", "Tarn", "Umb", "Vask", "Wend", "Aber", "Bolt", "Cray", "Drum", "Elst", "Frey", "Gast",
    "Hask", "Jarn", "Kest", "Lom", "Mosk",
]
PLACE_TAILS = ["port", "haven", "mouth", "burg", "stad", "vale", "minster", "fell", "brook", "field"]

ORG_ROOTS = [
    "Aldren", "Brightwater", "Copperleaf", "Dunmore", "Emberline", "Fairholm", "Greystone", "Hollowell",
    "Ironbridge", "Juniper", "Kestrel", "Lanternfall", "Meridian", "Northwind", "Oakhurst", "Pinecrest",
    "Quarry", "Redfern", "Silverlake", "Thornfield", "Umberto", "Valewood", "Westmarch", "Yellowbrick",
    "Zephyr", "Amberly", "Blackmere", "Cinderhall", "Driftwood", "Elmstead", "Foxglove", "Goldcrest",
    "Harrowgate", "Ivywood", "Larkspur", "Moonridge", "Netherby", "Oldcastle", "Primrose", "Ravenscar",
]
ORG_KINDS = ["Press", "Institute", "Foundation", "Society", "Guild", "Academy", "Observatory", "Trust"]

WORK_ADJECTIVES = [
    "Silent", "Hidden", "Crimson", "Last", "Golden", "Broken", "Distant", "Quiet", "Burning", "Frozen",
    "Endless", "Wandering", "Sleeping", "Forgotten", "Bitter", "Hollow", "Iron", "Pale", "Restless", "Velvet",
]
WORK_NOUNS = [
    "Harbour", "Orchard", "Lantern", "Meadow", "Citadel", "Compass", "Garden", "Tide", "Archive", "Bridge",
    "Mirror", "Lighthouse", "Valley", "Engine", "Winter", "Cathedral", "River", "Atlas", "Signal", "Forest",
    "Chronicle", "Furnace", "Island", "Voyage", "Fortress", "Canal", "Observatory", "Letter", "Tower", "Kingdom",
    "Labyrinth", "Monsoon", "Quarry", "Sonata", "Telescope", "Pilgrim", "Harvest", "Covenant", "Ember", "Glacier",
]

PROVINCES = ["Aldmark", "Belcoast", "Corvania", "Dunland", "Estria", "Fenmoor", "Galdor", "Harlow", "Istmark",
             "Jorvale"]

OCCUPATIONS = ["historian", "engineer", "poet", "botanist", "architect", "cartographer", "physician",
               "composer", "astronomer", "journalist"]
GENRES = ["novel", "memoir", "history", "poetry collection", "travel book", "treatise"]

PRODUCTS = [
    "kettle", "lamp", "stool", "blanket", "teapot", "ladder", "basket", "mirror", "clock", "vase", "rug",
    "bench", "candle", "bucket", "shovel", "compass", "kite", "drum", "flute", "globe", "helmet", "jar",
    "lantern", "mug", "notebook", "oar", "pillow", "quilt", "rope", "saddle", "tent", "umbrella", "wagon",
    "whistle", "anvil", "barrel",
]
CATEGORIES = ["kitchen", "garden", "outdoor", "office", "music", "bedroom", "workshop", "travel", "decor", "toys"]
REGIONS = ["North", "South", "East", "West", "Central", "Coastal", "Highland", "Lowland", "Inland", "Border"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun"]
