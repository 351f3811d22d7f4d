"""builtin:research — multi-hop questions over a generated encyclopedia.

Each split has its own world of invented people, cities, organisations and works, written as a
few hundred short encyclopedia entries (one per entity). A question follows a chain of 2-4
relations ("the founder of the publisher of the book X"): answering it needs one search and
one reading per hop, because each entry states only its own entity's facts. Distractors are
near-namesakes that share words with the entity a hop needs — relatives with the same surname,
sister organisations with the same root, sequels with the same title words — so a search
returns them next to the right entry and only reading the title tells them apart.

Knobs: `hops=N` or `hops=N-M` (default 2-4), `distractors=N` (near-namesakes per entity, 0-3,
default 1).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from toolself.evals.suites.common import (
    DEFAULT_SIZES, GENRES, GIVEN_NAMES, OCCUPATIONS, ORG_KINDS, ORG_ROOTS, PLACE_HEADS, PLACE_TAILS,
    PROVINCES, SURNAME_HEADS, SURNAME_TAILS, WORK_ADJECTIVES, WORK_NOUNS, check_split, knob_int, knob_range,
    reject_unknown, rng_for, slug, split_part,
)
from toolself.evals.task import Task

# How each relation is stated in the entry of its subject; the teacher reads facts with these.
PATTERNS: dict[str, str] = {
    "author": r"is an? [a-z ]+ by (.+?), published by",
    "publisher": r"published by (.+?) in \d{4}\.",
    "work_year": r"published by .+? in (\d{4})\.",
    "founder": r"founded in \d{4} by (.+?)\.",
    "org_year": r"founded in (\d{4}) by",
    "hq": r"is headquartered in (.+?)\.",
    "born_city": r"was born in \d{4} in (.+?)\.",
    "birth_year": r"was born in (\d{4}) in",
    "employer": r"works for (.+?)\.",
    "province": r"in the province of (.+?)\.",
}

# relation -> (subject kind, object kind or None for a terminal value)
RELATIONS: dict[str, tuple[str, str | None]] = {
    "author": ("work", "person"), "publisher": ("work", "org"), "work_year": ("work", None),
    "founder": ("org", "person"), "hq": ("org", "city"), "org_year": ("org", None),
    "born_city": ("person", "city"), "employer": ("person", "org"), "birth_year": ("person", None),
    "province": ("city", None),
}

NOUN_PHRASES = {
    "author": "the author of {x}", "publisher": "the publisher of {x}", "founder": "the founder of {x}",
    "hq": "the city where {x} is headquartered", "born_city": "the birthplace of {x}",
    "employer": "the employer of {x}",
}
FINAL_QUESTIONS = {
    "author": "Who wrote {x}?", "publisher": "Which organisation published {x}?", "founder": "Who founded {x}?",
    "hq": "In which city is {x} headquartered?", "born_city": "In which city was {x} born?",
    "employer": "Which organisation does {x} work for?", "work_year": "In which year was {x} published?",
    "org_year": "In which year was {x} founded?", "birth_year": "In which year was {x} born?",
    "province": "In which province is {x}?",
}


@dataclass
class Entity:
    name: str
    kind: str  # person | org | work | city
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def locator(self) -> str:
        return slug(self.name)


@dataclass
class World:
    """A split's entities and their encyclopedia entries."""

    entities: dict[str, Entity]
    documents: list[dict[str, str]]
    siblings: dict[str, list[str]]  # entity -> near-namesakes

    def of_kind(self, kind: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]


def _unique(rng: random.Random, make, taken: set[str]) -> str:
    for _ in range(1000):
        name = make()
        if name not in taken:
            taken.add(name)
            return name
    raise RuntimeError("ran out of distinct names; lower the world size")


def build_world(suite: str, split: str, seed: int, distractors: int = 1, size: float = 1.0) -> World:
    """Invent a world for one split. `size` scales the number of entities (mixed uses less)."""
    rng = rng_for(suite, split, seed, "world", distractors)
    heads, tails = split_part(SURNAME_HEADS, split), SURNAME_TAILS
    place_heads = split_part(PLACE_HEADS, split)
    org_roots = split_part(ORG_ROOTS, split)
    nouns = split_part(WORK_NOUNS, split)
    provinces = split_part(PROVINCES, split)
    taken: set[str] = set()
    entities: dict[str, Entity] = {}
    siblings: dict[str, list[str]] = {}
    family = 1 + distractors

    def group(names: list[str]) -> None:
        for name in names:
            siblings[name] = [n for n in names if n != name]

    n_cities = max(6, int(24 * size))
    for _ in range(n_cities):
        name = _unique(rng, lambda: rng.choice(place_heads) + rng.choice(PLACE_TAILS), taken)
        entities[name] = Entity(name, "city", {"province": rng.choice(provinces),
                                               "population": rng.randrange(20, 900) * 1000})
    cities = [e.name for e in entities.values()]

    n_families = max(6, int(40 * size))
    for _ in range(n_families):
        surname = _unique(rng, lambda: rng.choice(heads) + rng.choice(tails), taken)
        givens = rng.sample(GIVEN_NAMES, family)
        members = [f"{given} {surname}" for given in givens]
        for name in members:
            taken.add(name)
            entities[name] = Entity(name, "person", {"born_city": rng.choice(cities),
                                                     "birth_year": rng.randrange(1840, 1960),
                                                     "occupation": rng.choice(OCCUPATIONS)})
        group(members)
    people = [e.name for e in entities.values() if e.kind == "person"]

    n_roots = max(4, int(14 * size))
    roots = rng.sample(org_roots, min(n_roots, len(org_roots)))
    for root in roots:
        kinds = rng.sample(ORG_KINDS, min(family, len(ORG_KINDS)))
        members = [f"{root} {kind}" for kind in kinds]
        for name in members:
            taken.add(name)
            founder = rng.choice(people)
            year = entities[founder].facts["birth_year"] + rng.randrange(22, 55)
            entities[name] = Entity(name, "org", {"founder": founder, "org_year": year, "hq": rng.choice(cities)})
        group(members)
    orgs = [e.name for e in entities.values() if e.kind == "org"]
    for name in people:
        entities[name].facts["employer"] = rng.choice(orgs)

    sequel_forms = ["{t} Revisited", "Return to {t}", "{t} II"]
    n_works = max(6, int(50 * size))
    for _ in range(n_works):
        base = _unique(rng, lambda: f"The {rng.choice(WORK_ADJECTIVES)} {rng.choice(nouns)}", taken)
        members = [base] + [form.format(t=base) for form in sequel_forms[:distractors]]
        for name in members:
            taken.add(name)
            publisher = rng.choice(orgs)
            founded = entities[publisher].facts["org_year"]
            year = founded + rng.randrange(1, max(2, min(60, 2024 - founded)))
            entities[name] = Entity(name, "work", {"author": rng.choice(people), "publisher": publisher,
                                                   "work_year": year, "genre": rng.choice(GENRES)})
        group(members)

    documents = [{"id": e.locator, "title": e.name, "text": _entry(e, entities)} for e in entities.values()]
    return World(entities, documents, siblings)


def _entry(e: Entity, entities: dict[str, Entity]) -> str:
    f = e.facts
    if e.kind == "person":
        article = "an" if f["occupation"][0] in "aeiou" else "a"
        lines = [f"{e.name} is {article} {f['occupation']}.", f"{e.name} was born in {f['birth_year']} in {f['born_city']}.",
                 f"{e.name} works for {f['employer']}."]
        founded = [o for o in entities.values() if o.kind == "org" and o.facts["founder"] == e.name]
        lines += [f"{e.name} started {o.name} as its founder." for o in founded[:2]]
        wrote = [w.name for w in entities.values() if w.kind == "work" and w.facts["author"] == e.name]
        if wrote:
            lines.append(f"Known works: {', '.join(wrote[:3])}.")
        return " ".join(lines)
    if e.kind == "org":
        kind = e.name.rsplit(" ", 1)[1].lower()
        article = "an" if kind[0] in "aeiou" else "a"
        lines = [f"{e.name} is {article} {kind} founded in {f['org_year']} by {f['founder']}.",
                 f"{e.name} is headquartered in {f['hq']}."]
        works = [w.name for w in entities.values() if w.kind == "work" and w.facts["publisher"] == e.name]
        if works:
            lines.append(f"Its catalogue includes {', '.join(works[:3])}.")
        return " ".join(lines)
    if e.kind == "work":
        article = "an" if f["genre"][0] in "aeiou" else "a"
        return (f"{e.name} is {article} {f['genre']} by {f['author']}, published by {f['publisher']} "
                f"in {f['work_year']}.")
    born = [p.name for p in entities.values() if p.kind == "person" and p.facts["born_city"] == e.name]
    text = (f"{e.name} is a city in the province of {f['province']}. "
            f"It has about {f['population']:,} inhabitants.")
    if born:
        text += f" Notable natives include {', '.join(born[:2])}."
    return text


def start_phrase(e: Entity) -> str:
    if e.kind == "work":
        return f'the book "{e.name}"'
    if e.kind == "org":
        return f'the organisation "{e.name}"'
    return e.name


def sample_chain(world: World, rng: random.Random, hops: int, end_kinds: tuple[str | None, ...] | None = None,
                 start_kinds: tuple[str, ...] = ("work", "org", "person")) -> list[dict[str, str]] | None:
    """A random chain of `hops` relations without repeated entities, or None if it got stuck.
    `end_kinds` restricts the kind of the final value (None means a terminal value)."""
    start = rng.choice([e for e in world.entities.values() if e.kind in start_kinds])
    chain: list[dict[str, str]] = []
    seen = {start.name}
    current = start
    for hop in range(hops):
        last = hop == hops - 1
        options = []
        for relation, (subject, target) in RELATIONS.items():
            if subject != current.kind:
                continue
            if not last and target is None:
                continue
            if last and end_kinds is not None and target not in end_kinds:
                continue
            value = current.facts[relation]
            if target is not None and value in seen:
                continue
            options.append((relation, target, value))
        if not options:
            return None
        relation, target, value = rng.choice(options)
        chain.append({"entity": current.name, "locator": current.locator, "relation": relation,
                      "value": str(value)})
        if target is None:
            break
        seen.add(value)
        current = world.entities[value]
    return chain if len(chain) == hops else None


def chain_question(world: World, chain: list[dict[str, str]]) -> str:
    phrase = start_phrase(world.entities[chain[0]["entity"]])
    for step in chain[:-1]:
        phrase = NOUN_PHRASES[step["relation"]].format(x=phrase)
    question = FINAL_QUESTIONS[chain[-1]["relation"]].format(x=phrase)
    return question[0].upper() + question[1:]


def read_fact(relation: str, text: str, entity: str | None = None) -> str | None:
    """The value of `relation` stated in an entry's text (the entry of `entity` when given)."""
    if entity is not None:
        index = text.find(entity)
        if index == -1:
            return None
    match = re.search(PATTERNS[relation], text)
    return match.group(1).strip() if match else None


def generate(split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
    check_split(split)
    low, high = knob_range(knobs, "hops", (2, 4), 1, 6)
    distractors = knob_int(knobs, "distractors", 1, 0, 3)
    reject_unknown("research", knobs)
    n = DEFAULT_SIZES[split] if n is None else n
    world = build_world("research", split, seed, distractors)
    rng = rng_for("research", split, seed, "questions", low, high, distractors)
    tasks: list[Task] = []
    questions: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * max(n, 1):
            raise RuntimeError(f"could only make {len(tasks)} distinct research questions; enlarge the world")
        hops = rng.randint(low, high)
        chain = sample_chain(world, rng, hops)
        if chain is None:
            continue
        question = chain_question(world, chain)
        if question in questions:
            continue
        questions.add(question)
        answer = chain[-1]["value"]
        tasks.append(Task(
            id=f"research-{split}-{seed}-{len(tasks):04d}", question=question, answer=answer, level=hops,
            family="research", split=split, documents=world.documents,
            metadata={"suite": "research", "seed": seed, "hops": hops, "chain": chain,
                      "distractors": {step["entity"]: world.siblings.get(step["entity"], []) for step in chain}},
        ))
    return tasks
