"""The parts of a training run's settings that override someone else's defaults: the agent's
budgets (`AgentSettings`) and each stage's training options (`RFTOptions`, `KTOOptions`).

Each is a record whose fields are the overridden class's own, generated from it so that the two
cannot drift, and all of them start *unset*: a record holds what the user chose and nothing
else. That is what a run folder records (`to_dict` gives only the fields that were set, so a
state file written when these settings were plain dicts compares equal), and what lets the
student's budgets, a preset's and the user's be layered in that order. A name the overridden
class lacks is an error naming it, raised when the record is made.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from toolself.agent import AgentSettings
from toolself.train.kernels import KernelArguments
from toolself.train.lora import refuse_fp16_without_gpu
from toolself.train.stage_options import KTOOptions, RFTOptions

T = TypeVar("T", bound="Overrides")


class Unset:
    """The value of a field the user did not set (None is a value: `max_total_tokens: null`
    lifts the token cap)."""

    _instance: ClassVar["Unset | None"] = None

    def __new__(cls) -> "Unset":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"  # pickles as this module's one instance, so `is UNSET` holds in a step's process


UNSET = Unset()


def overriding(*sources: type, exclude: tuple[str, ...] = ()) -> Callable[[type[T]], type[T]]:
    """Make the decorated class a frozen dataclass with every field of `sources` (but
    `exclude`), unset by default, help and bounds kept."""

    def decorate(cls: type[T]) -> type[T]:
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for source in sources:
            for f in dataclasses.fields(source):
                if f.name in exclude or f.name in annotations:
                    continue
                annotations[f.name] = f"{f.type} | Unset"
                setattr(cls, f.name, dataclasses.field(default=UNSET, metadata=f.metadata))
        cls.__annotations__ = annotations
        return dataclasses.dataclass(frozen=True)(cls)

    return decorate


@dataclasses.dataclass(frozen=True)
class Overrides:
    """What the records share: made from a dict (`from_dict`), back to one (`to_dict`)."""

    what: ClassVar[str] = "setting"

    def __post_init__(self) -> None:
        for f in self._fields():
            minimum, value = f.metadata.get("min"), getattr(self, f.name)
            if minimum is not None and isinstance(value, (int, float)) and value < minimum:
                raise ValueError(f"{self.what} {f.name} must be at least {minimum:g}, not {value}")
        self.check()

    def check(self) -> None:
        """Whatever else makes the record valid; raises ValueError."""

    @classmethod
    def _fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.default is UNSET]

    @classmethod
    def from_dict(cls: type[T], data: "Mapping[str, Any] | T | None") -> T:
        """The record of `data` (a record is returned as it is); a name that is not a field is
        an error naming it."""
        if isinstance(data, cls):
            return data
        data = dict(data or {})
        known = {f.name for f in cls._fields()}
        given = {k: v for k, v in data.items() if k in known}
        rest = {k: v for k, v in data.items() if k not in known}
        return cls._make(given, rest)

    @classmethod
    def _make(cls: type[T], given: dict[str, Any], rest: dict[str, Any]) -> T:
        if rest:
            raise ValueError(f"unknown {cls.what}{'s' if len(rest) > 1 else ''} {sorted(rest)}; "
                             f"known: {', '.join(sorted(f.name for f in cls._fields()))}")
        return cls(**given)

    def set_fields(self) -> dict[str, Any]:
        """The fields that were set, with their values."""
        return {f.name: getattr(self, f.name) for f in self._fields() if getattr(self, f.name) is not UNSET}

    def to_dict(self) -> dict[str, Any]:
        """The fields that were set, with the values as given (a record among them as its dict)."""
        return {k: v.to_dict() if isinstance(v, Overrides) else v for k, v in self.set_fields().items()}

    def merged(self: T, other: "Overrides | Mapping[str, Any] | None") -> T:
        """This record with what `other` sets on top."""
        return type(self).from_dict({**self.to_dict(), **type(self).from_dict(other).to_dict()})


NOT_OVERRIDDEN = ("method", "configurator", "reconfigure", "preset", "freeze", "time_limit")
"""`AgentSettings` fields a training run does not take from the user: the method decides the
first five (`variants.settings_for`), the attempt's timeout the last."""


@overriding(AgentSettings, exclude=NOT_OVERRIDDEN)
class AgentOverrides(Overrides):
    """`AgentSettings` fields a CAT run sets for every collection and evaluation: budgets,
    context modes, dialect, prompts (see `AgentSettings` for each)."""

    what: ClassVar[str] = "agent setting"

    def check(self) -> None:
        AgentSettings(**self.to_dict())


SET_BY_THE_RUN = ("output_dir", "max_length", "seed")
"""Trainer fields every training command sets itself (from its folder, `--max-length`, `--seed`)."""

RENAMED = (("activation_checkpointing", "gradient_checkpointing"),
           ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"))
"""(new, old) names of TrainingArguments fields: transformers 5.24 renamed them (the old names stay
there as deprecated aliases); before it, the new names are unknown."""


def installed_spelling(options: Mapping[str, Any], fields: set[str]) -> dict[str, Any]:
    """`options` with each renamed field under the installed configuration's own name (the new
    one where it exists), so that a recipe or a run folder written under one transformers trains
    and resumes under the other."""
    out = dict(options)
    for new, old in RENAMED:
        given, wanted = (old, new) if new in fields else (new, old)
        if given in out and wanted in fields and wanted not in out:
            out[wanted] = out.pop(given)
    return out


@dataclasses.dataclass(frozen=True)
class TrainerOverrides(Overrides):
    """A stage's training options: the trl-free ones as typed fields, any other field of the
    stage's TRL config in `extra`, checked against that config when there is one (importing
    TRL takes seconds, so only then)."""

    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    config: ClassVar[str] = ""  # the stage's TRL config, `module:Class`

    def config_fields(self) -> set[str]:
        module, _, name = self.config.partition(":")
        return {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))}

    @classmethod
    def _make(cls: type[T], given: dict[str, Any], rest: dict[str, Any]) -> T:
        return cls(**given, extra=rest)

    def __post_init__(self) -> None:
        if self.extra:
            object.__setattr__(self, "extra", installed_spelling(self.extra, self.config_fields()))
        super().__post_init__()

    def check(self) -> None:
        reserved = sorted(set(self.extra) & set(SET_BY_THE_RUN))
        if reserved:
            raise ValueError(f"{reserved} {'is' if len(reserved) == 1 else 'are'} set by the run itself "
                             f"(its folder, --max-length, --seed), not as {self.what}s")
        unknown = sorted(set(self.extra) - self.config_fields()) if self.extra else []
        if unknown:
            raise ValueError(f"unknown {self.what}{'s' if len(unknown) > 1 else ''} {unknown}: not "
                             f"{'fields' if len(unknown) > 1 else 'a field'} of the stage's training configuration "
                             "(TrainingArguments and TRL's config)")
        refuse_fp16_without_gpu(self.extra.get("fp16"))

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), **self.extra}


@overriding(RFTOptions, KernelArguments)
class RFTOverrides(TrainerOverrides):
    """Stage I's training options (`RFTConfig` fields)."""

    what: ClassVar[str] = "RFT option"
    config: ClassVar[str] = "toolself.train.rft_config:RFTConfig"


@overriding(KTOOptions, KernelArguments)
class KTOOverrides(TrainerOverrides):
    """Stage II's training options (`CATKTOConfig` fields)."""

    what: ClassVar[str] = "KTO option"
    config: ClassVar[str] = "toolself.train.kto_config:CATKTOConfig"
