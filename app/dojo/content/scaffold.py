"""Skeletons for new content: `dojo dev new-lab SLUG` and `dojo dev new-lesson SLUG`.

A new lab is complete and lint-clean from the first minute, and passes its own meta-test:
a small exercise (drop redelivered events by id) with a starter that fails, a solution that
passes, one check raising `dojo.checks.CheckFailure`, and one mutant stored as an overlay
whose golden message the author records with `dojo dev golden` (`new_lab` does it once).
The author then replaces the exercise with the real one, step by step (docs/add-a-lab.md).
A new lesson is a lesson.md with every required section and a cards.yaml with the four card
kinds the linter asks for, each paragraph saying what belongs there.
"""

from __future__ import annotations

import re
from pathlib import Path

from dojo.content.overlay import make_patch, patch_name

SLUG = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")


class ScaffoldError(ValueError):
    """A slug that cannot be used, or content that is already there."""


def _check_slug(slug: str) -> None:
    if not SLUG.match(slug):
        raise ScaffoldError(f"{slug!r} is not a slug: lower-case letters, digits and single "
                            "hyphens, starting with a letter (`rate-limiter`)")


def _write(path: Path, text: str, created: list[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    created.append(path)


# -- labs -----------------------------------------------------------------------------------

_LAB_YAML = """\
# A new lab (dojo dev new-lab). docs/lab-contract.md describes every field; docs/add-a-lab.md
# walks through replacing this skeleton's exercise with yours.
id: {slug}
title: "{title}: drop redelivered events (skeleton exercise; replace it)"
lessons: []                 # the lesson ids this lab practises, e.g. [idempotent-consumer]
services: []                # add postgres and/or kafka when the checks need them
files: [{module}.py]
time_limits: {{check_seconds: 30, run_seconds: 120}}
stages:
  - id: dedupe
    title: Drop a redelivered event by its id
    proves: "A redelivered event is kept once, by its event id, and the others keep their order"
    # lesson: "<lesson-id>#<section-slug>"   (a lesson and one of its headings)
    hints:
      - "Remember the ids you have already kept; an id seen before is a redelivery."
      - "A set of ids and one pass over the events, in order, is enough."
"""

_README = """\
# {title}

A skeleton made by `dojo dev new-lab {slug}`: a tiny exercise so that every part of a lab is
there and working. Replace it with your lab, one part at a time (docs/add-a-lab.md).

Your file is `{module}.py`. Start with `dojo lab start {slug}`, check with
`dojo lab check {slug}`.

## Stage 1: Drop a redelivered event by its id

`unique_events(events)` gets `(event_id, payload)` pairs as a broker delivered them, at least
once, so an event may come again. Return the pairs with every redelivery dropped: an event
is the same event when its **id** is the same, whatever its payload; two events with equal
payloads are still two events. Keep the order of first delivery.
"""

_STARTER = '''\
"""{title}: your code. The README says what to build."""

from __future__ import annotations


def unique_events(events: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The events with every redelivery (an id seen before) dropped, in delivery order."""
    raise NotImplementedError("drop the redelivered events (README, stage 1)")
'''

_SOLUTION = '''\
"""{title}: the reference solution."""

from __future__ import annotations


def unique_events(events: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The events with every redelivery (an id seen before) dropped, in delivery order."""
    seen: set[str] = set()
    kept = []
    for event_id, payload in events:
        if event_id in seen:
            continue
        seen.add(event_id)
        kept.append((event_id, payload))
    return kept
'''

_MUTANT_FROM = "        if event_id in seen:\n            continue\n        seen.add(event_id)\n"
_MUTANT_TO = "        if payload in seen:\n            continue\n        seen.add(payload)\n"

_CHECK = '''\
"""Stage dedupe: a redelivered event is kept once, by its id.

Written with the lab kit, `dojo.checks` (docs/lab-contract.md lists it): `call` runs the
learner's function (a stub fails as "not written yet"), `CheckFailure` says what was expected,
what happened and the evidence, `table` formats the evidence. Fixtures: `learner`, and
`database` / `kafka` once lab.yaml lists the services.
"""

import pytest

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("dedupe")


def test_a_redelivery_is_dropped_by_event_id(learner):
    module = learner.module("{module}")
    delivered = [("e1", "placed"), ("e2", "paid"), ("e1", "placed"), ("e3", "paid")]
    got = call(module.unique_events, list(delivered))
    wanted = [("e1", "placed"), ("e2", "paid"), ("e3", "paid")]
    if got != wanted:
        dropped = [event for event in wanted if event not in (got or [])]
        raise CheckFailure(
            "unique_events must drop a redelivered event by its id, and keep every other event"
            " in delivery order.",
            expected=f"{{wanted}}",
            actual=f"{{got!r}}"
                   + (f" (dropped {{dropped}}: another event with the same payload is still "
                      "another event)" if dropped else ""),
            evidence="delivered, in order:\\n" + table(delivered, ("event_id", "payload")),
            # lesson="<lesson-id>#<section-slug>",  the section that explains the mistake
        )
'''

_MUTANT_YAML = """\
mistake: "Drops an event whose payload was seen before, instead of one whose id was"
stage: dedupe
check: a_redelivery_is_dropped_by_event_id
mentions: ["same payload"]
"""


def _module_name(slug: str) -> str:
    return slug.replace("-", "_")


def _title(slug: str) -> str:
    return slug.replace("-", " ").capitalize()


def new_lab(root: Path, slug: str) -> list[Path]:
    """Create labs/<slug>/ and solutions/<slug>/ under `root`; returns the files written.
    The mutant's expected.txt is left to `dojo dev golden` (it runs the check)."""
    _check_slug(slug)
    lab, solution = root / "labs" / slug, root / "solutions" / slug
    for folder in (lab, solution):
        if folder.exists():
            raise ScaffoldError(f"{folder} exists already; pick another slug")
    values = {"slug": slug, "title": _title(slug), "module": _module_name(slug)}
    module = f"{values['module']}.py"
    solution_text = _SOLUTION.format(**values)
    mutant_text = solution_text.replace(_MUTANT_FROM, _MUTANT_TO)
    created: list[Path] = []
    _write(lab / "lab.yaml", _LAB_YAML.format(**values), created)
    _write(lab / "README.md", _README.format(**values), created)
    _write(lab / "starter" / module, _STARTER.format(**values), created)
    _write(lab / "checks" / "test_01_dedupe.py", _CHECK.format(**values), created)
    mutant = lab / "mutants" / "dedupe-by-payload"
    _write(mutant / "mutant.yaml", _MUTANT_YAML, created)
    _write(mutant / patch_name(module),
           make_patch(module, solution_text, mutant_text, old_label=f"solution/{module}",
                      new_label=f"mutant/{module}"), created)
    _write(solution / module, solution_text, created)
    return created


# -- lessons --------------------------------------------------------------------------------

_SIXTY = (
    "This paragraph is the answer I would say aloud in one minute, and the skeleton keeps it "
    "here only to show the shape. Replace it with the real answer: first the short definition "
    "in one sentence, then the mechanism that makes it work, then the trade-off a senior "
    "engineer weighs before choosing it, and last one concrete example from production work. "
    "Keep it between one hundred and twenty and one hundred and eighty words, because that is "
    "what fits in sixty seconds of calm speech. Write it to be spoken, with short sentences "
    "and no lists, and make every key point of the headline card appear in it, since the "
    "scorer looks for those points in a typed answer. The headline card in cards.yaml repeats "
    "this paragraph word for word, so change both together when you edit the answer later."
)

_LESSON = """\
---
id: {slug}
title: "{title}"
track: {track}
order: {order}
question: "What is {topic}, and when would you use it?"
seconds: 60
related: []
sources:
  - "Where each fact comes from, findable by a reader: official docs, a KIP, a release note"
---

## The 60-second answer

{sixty}

## What the interviewer is measuring

Say in two or three sentences what a good answer shows the interviewer: which experience,
which judgement, and which mistake a weaker candidate makes here.

## Deep dive

### The mechanism

Explain how it works, step by step, with the names a practitioner uses. Add more `###`
subsections as the topic needs; a diagram is a fenced block with the `diagram` info string.

## When I would not use it

Name the cases where a simpler design wins, and why.

## Common mistakes

| Mistake | Consequence | Fix |
|---|---|---|
| Replace this row with a real mistake | What goes wrong in production | What to do instead |
| A second mistake people make | Its consequence | Its fix |
| A third mistake | Its consequence | Its fix |
| A fourth mistake | Its consequence | Its fix |

## Follow-up questions

### Level 1

**Q: What is the first follow-up an interviewer asks?**

A: Answer it in two or three sentences.

### Level 2

**Q: What is a deeper follow-up?**

A: Answer it with the trade-off it probes.

### Level 3

**Q: What is the hardest follow-up?**

A: Answer it with the failure case it probes.

## Practise it

Name the lab and stage that practise this lesson, with the commands to run them; when no lab
practises it yet, say what to try by hand.

## Sources

- Replace with the sources listed in the front matter.
"""

_CARDS = """\
lesson: {slug}
cards:
  - id: {slug}-headline
    kind: headline
    question: "What is {topic}, and when would you use it?"
    answer: |
{answer}
    measuring: "Replace with what the interviewer learns from the answer."
    key_points:
      - id: definition
        text: "Starts with a short definition in one sentence"
        patterns: ['short definition in one sentence']
      - id: mechanism
        text: "Explains the mechanism that makes it work"
        patterns: ['mechanism\\W+(\\w+\\W+){{0,3}}work']
      - id: trade-off
        text: "Names the trade-off before choosing it"
        patterns: ['trade-off\\W+(\\w+\\W+){{0,6}}(weighs|choosing)']
      - id: example
        text: "Gives a concrete example from production"
        patterns: ['concrete example\\W+(\\w+\\W+){{0,3}}production']

  - id: {slug}-followup-1
    kind: followup
    question: "What is the first follow-up an interviewer asks?"
    answer: >-
      Replace this answer with two or three sentences that say the first point, then
      the second point, then why it matters in production.
    key_points:
      - id: first
        text: "States the first point"
        patterns: ['say the first point']
      - id: second
        text: "Adds the second point"
        patterns: ['then the second point']
      - id: why
        text: "Says why it matters"
        patterns: ['why it matters']
      - id: production
        text: "Ties it to production"
        patterns: ['matters in production']

  - id: {slug}-followup-2
    kind: followup
    question: "What is a deeper follow-up?"
    answer: >-
      Replace this answer with the trade-off it probes: what you gain, what you pay,
      and the case where you would choose the other way.
    key_points:
      - id: gain
        text: "What you gain"
        patterns: ['what you gain']
      - id: pay
        text: "What you pay"
        patterns: ['what you pay']
      - id: other-way
        text: "When to choose the other way"
        patterns: ['choose the other way']
      - id: trade-off
        text: "Names the trade-off"
        patterns: ['the trade-off it probes']

  - id: {slug}-spot
    kind: spot-the-mistake
    question: "Replace with a flawed design from the common-mistakes table: what is wrong?"
    answer: >-
      Replace this answer: name the mistake in the design, the consequence it has in
      production, and the fix that avoids it.
    key_points:
      - id: mistake
        text: "Names the mistake"
        patterns: ['name the mistake']
      - id: consequence
        text: "Says its consequence"
        patterns: ['consequence it has']
      - id: fix
        text: "Gives the fix"
        patterns: ['fix that avoids']
      - id: production
        text: "In production terms"
        patterns: ['has in production']
"""


def _next_lesson_number(lessons: Path) -> int:
    numbers = [int(p.name[:2]) for p in lessons.iterdir()
               if p.is_dir() and re.match(r"^\d\d-", p.name)] if lessons.is_dir() else []
    return max(numbers, default=0) + 1


def _next_order(lessons: Path, track: str) -> int:
    orders = []
    if lessons.is_dir():
        for path in lessons.glob("*/lesson.md"):
            front = path.read_text(encoding="utf-8").split("---", 2)[1:2]
            text = front[0] if front else ""
            if re.search(rf"^track:\s*{re.escape(track)}\s*$", text, re.MULTILINE):
                found = re.search(r"^order:\s*(\d+)", text, re.MULTILINE)
                orders.append(int(found.group(1)) if found else 0)
    return max(orders, default=0) + 1


def new_lesson(root: Path, slug: str, track: str = "next") -> list[Path]:
    """Create lessons/<NN>-<slug>/ (the next free number) with lesson.md and cards.yaml."""
    _check_slug(slug)
    lessons = root / "lessons"
    existing = [p for p in lessons.glob(f"[0-9][0-9]-{slug}")] if lessons.is_dir() else []
    if existing:
        raise ScaffoldError(f"{existing[0]} exists already; pick another slug")
    number = _next_lesson_number(lessons)
    if number > 99:
        raise ScaffoldError("lesson folders are numbered 01 to 99, and 99 is taken")
    folder = lessons / f"{number:02d}-{slug}"
    values = {"slug": slug, "title": _title(slug), "topic": slug.replace("-", " "),
              "track": track, "order": _next_order(lessons, track)}
    sixty = "\n".join(_wrap(_SIXTY))
    answer = "\n".join("      " + line for line in _wrap(_SIXTY))
    created: list[Path] = []
    _write(folder / "lesson.md", _LESSON.format(sixty=sixty, **values), created)
    _write(folder / "cards.yaml", _CARDS.format(answer=answer, **values), created)
    return created


def _wrap(text: str, width: int = 90) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    if current:
        lines.append(current)
    return lines
