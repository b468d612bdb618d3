"""Perturbations of one instruction (a task description) for semantic clusters (RobustFlow 3.2).

A cluster holds a task's original description and its variants; every variant asks for the same
workflow. Five perturbation types, in the order of the robustness table's columns:

- ``paraphrase``: the form changes (openings imperative <-> declarative, the style of the step list
  (connective sentences, one "The job must a; then b; and finally c." sentence, a numbered list), the
  connectives, sentence merges, each step's wording (another clause of the v1 phrase bank for the same
  step, or bank synonyms); for world v0 text also ", then " splits and how a step names its tool);
  meaning, literals, step order and step count stay, length within 20%.
- ``requirements``: feasibility-preserving constraints appended to the original text, built from the
  task and its reference workflow (a step cap no lower than the reference's length, the task's retry
  cap, its timeout, the output format, ...), so the reference workflow still satisfies all of them.
- ``noise_light`` / ``noise_moderate`` / ``noise_heavy``: TextAttack-style word-level noise (synonym
  substitution, insertion, swap of neighbours, deletion) touching a fraction rho of the unprotected
  words, rho drawn uniformly from [0.2, 0.4], [0.4, 0.6] or [0.6, 0.8].

Protected spans (tool names and aliases, paths and identifiers, numbers, upper-case format names, URLs,
quoted literals) survive every perturbation byte-for-byte and in order. Each variant's generator comes
from (seed, task id, perturbation type, variant index), so variants do not depend on which tasks are
built together or in which order.

``InstructionPerturber`` asks an LLM ``Backend`` for paraphrases and requirement variants instead, with
prompts that list the literals to keep; each answer is validated (``check_variant``), a failed check is
sent back with the error, and after ``attempts`` answers the variant falls back to the rules with the
reason recorded, so a cluster is never lost.
"""

from __future__ import annotations

__all__ = [
    "ORIGINAL", "PERTURBATION_TYPES", "NOISE_RATES", "LLM_TYPES", "SOURCES", "LENGTH_TOLERANCE", "Variant",
    "original_variant", "check_type", "variant_rng", "protected_spans", "protected_texts", "tool_mentions",
    "VariantError", "literal_problem", "check_variant", "NOISE_SYNONYMS", "INSERT_WORDS", "NOISE_OPS",
    "noise_rate", "unprotected_words", "inject_noise", "FIRST_WORDS", "MIDDLE_WORDS", "LAST_WORDS",
    "MUST_LEADS", "MUST_LINKS", "MUST_ENDS", "LIST_HEADERS", "STYLES", "StepList", "find_step_list",
    "step_count", "render_steps", "reword_clause", "PARAPHRASE_RULES", "PARAPHRASE_CANDIDATES",
    "FALLBACK_FRAME", "paraphrase_instruction", "REQUIREMENT_TEMPLATES", "REQUIREMENT_LEADS",
    "requirement_values", "augment_requirements", "rule_variant", "SYSTEM_PROMPTS", "llm_messages",
    "extract_answer", "InstructionRequest", "InstructionPerturber",
]

import functools
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from resilibench.llm import Backend, GenerationConfig, Message, ask_until_valid
from resilibench.llm import extract_answer as answer_block

from ..core.registry import OPERATION_PHRASES, ToolRegistry, default_registry
from ..core.tasks import phrases as phrases
from ..core.tasks.library import Task
from ..core.workflow import Workflow
from ..metrics.perturb import SYNONYMS, paraphrase, reword

ORIGINAL = "original"
PERTURBATION_TYPES = ("paraphrase", "requirements", "noise_light", "noise_moderate", "noise_heavy")
NOISE_RATES: dict[str, tuple[float, float]] = {
    "noise_light": (0.2, 0.4), "noise_moderate": (0.4, 0.6), "noise_heavy": (0.6, 0.8)}
LLM_TYPES = ("paraphrase", "requirements")
SOURCES = ("original", "rules", "llm")
LENGTH_TOLERANCE = 0.2  # a paraphrase keeps its length within 20% of the original


# --- variants -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One formulation of a task: its id ("noise_heavy-0"), perturbation type (or "original"), text,
    the drawn noise rate (None for other types), where it came from ("original", "rules" or "llm") and
    notes: what was applied (noise operations, rules, added requirements) and, for LLM variants, the
    attempts and errors (with the reason of a fallback to the rules)."""

    variant_id: str
    perturbation: str
    text: str
    rate: float | None = None
    source: str = "rules"
    notes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"variant_id": self.variant_id, "perturbation": self.perturbation, "text": self.text,
                "rate": self.rate, "source": self.source, "notes": self.notes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Variant:
        """A variant from ``to_dict`` data; ValueError naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"a variant must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("variant_id", "perturbation", "text", "source") if k not in data]
        if missing:
            raise ValueError(f"variant is missing field(s) {missing}")
        if data["perturbation"] not in (ORIGINAL, *PERTURBATION_TYPES):
            raise ValueError(f"variant {data['variant_id']!r}: perturbation {data['perturbation']!r} not in "
                             f"{(ORIGINAL, *PERTURBATION_TYPES)}")
        if data["source"] not in SOURCES:
            raise ValueError(f"variant {data['variant_id']!r}: source {data['source']!r} not in {SOURCES}")
        if not isinstance(data["text"], str):
            raise ValueError(f"variant {data['variant_id']!r}: text must be a string")
        rate = data.get("rate")
        return cls(str(data["variant_id"]), data["perturbation"], data["text"],
                   None if rate is None else float(rate), data["source"], dict(data.get("notes") or {}))


def original_variant(task: Task) -> Variant:
    """Variant 0 of every cluster: the task's own description."""
    return Variant(f"{ORIGINAL}-0", ORIGINAL, task.description, None, "original")


def check_type(perturbation: str) -> None:
    if perturbation not in PERTURBATION_TYPES:
        raise ValueError(f"perturbation type must be one of {', '.join(PERTURBATION_TYPES)}, got {perturbation!r}")


def variant_rng(seed: int, task_id: str, perturbation: str, index: int) -> np.random.Generator:
    """The generator of one variant: an independent stream per (seed, task id, type, variant index)."""
    check_type(perturbation)
    return np.random.default_rng([seed, zlib.crc32(task_id.encode()), PERTURBATION_TYPES.index(perturbation), index])


# --- protected spans ----------------------------------------------------------------------------------

_URL = re.compile(r"\b(?:https?|ftp)://[^\s<>\"'`]+")
_QUOTED = re.compile(r"`[^`\n]+`|\"[^\"\n]+\"|(?<![\w'])'[^'\n]+'(?![\w'])")
# A token of word characters possibly joined by . / - : (it ends with a word character, so a full stop
# after a path is not part of it); protected when it holds _, /, ., or a digit.
_TOKEN = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_./:\-]*[A-Za-z0-9_])?")
_UPPER = re.compile(r"\b[A-Z][A-Z0-9]+\b")
_TRAILING = ".,;:!?)]}"
_ITEM_NUMBER = re.compile(r"^\d+(?=\. )", re.MULTILINE)  # a numbered list's item numbers are form, not literals


def _tool_regex(registry: ToolRegistry, group: str = "") -> str:
    """A tool name or alias standing alone (not inside a path or a longer identifier)."""
    names = {*registry.names, *(a for tool in registry.tools for a in tool.aliases)}
    return (r"(?<![\w./-])(" + group + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
            + r")(?![\w/-])")


@cache
def _tool_pattern(registry: ToolRegistry) -> re.Pattern[str]:
    return re.compile(_tool_regex(registry))


def protected_spans(text: str, registry: ToolRegistry | None = None) -> list[tuple[int, int]]:
    """Sorted, disjoint (start, end) spans no perturbation may touch: tool names and aliases, URLs,
    quoted or backticked literals, paths and identifiers (tokens with _, /, . or digits, numbers among
    them, but not the item numbers of a numbered list) and upper-case names (XML, JSON, API)."""
    registry = registry or default_registry()
    spans = [m.span() for m in _tool_pattern(registry).finditer(text)]
    for m in _URL.finditer(text):
        url = m.group(0).rstrip(_TRAILING)
        spans.append((m.start(), m.start() + len(url)))
    spans += [m.span() for m in _QUOTED.finditer(text)]
    items = {m.start() for m in _ITEM_NUMBER.finditer(text)}
    spans += [m.span() for m in _TOKEN.finditer(text) if re.search(r"[_/.\d]", m.group(0)) and m.start() not in items]
    spans += [m.span() for m in _UPPER.finditer(text)]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def protected_texts(text: str, registry: ToolRegistry | None = None) -> list[str]:
    """The protected spans' texts, in order."""
    return [text[a:b] for a, b in protected_spans(text, registry)]


def tool_mentions(text: str, registry: ToolRegistry | None = None) -> list[str]:
    """Tool names and aliases named in ``text``, in order, as written."""
    return [m.group(1) for m in _tool_pattern(registry or default_registry()).finditer(text)]


def _overlaps(start: int, end: int, spans: Sequence[tuple[int, int]]) -> bool:
    return any(a < end and start < b for a, b in spans)


# --- validation ---------------------------------------------------------------------------------------


class VariantError(ValueError):
    """A variant that breaks a rule of its perturbation; the message is what an LLM is told."""


_STEP_CAP = re.compile(r"\b(?:at most|no more than|up to|maximum of|max(?:imum)?)\s+(\d+)\s+(?:steps|tool calls|tools|"
                       r"calls|nodes)\b", re.IGNORECASE)


def literal_problem(original: str, text: str, registry: ToolRegistry | None = None) -> str | None:
    """What breaks the literals of ``original`` in ``text`` (a protected span missing or out of order, a
    tool name added or dropped), as a message for a model; None when every literal is kept."""
    registry = registry or default_registry()
    position = 0
    for span in protected_texts(original, registry):
        found = text.find(span, position)
        if found < 0:
            where = "missing" if span in text else "out of order"
            return (f"The literal {span!r} is {where}: copy every tool name, path, identifier, number and format "
                    "name byte-for-byte and in the original order.")
        position = found + len(span)
    theirs, ours = tool_mentions(text, registry), tool_mentions(original, registry)
    if theirs != ours:
        added = [t for t in dict.fromkeys(theirs) if theirs.count(t) > ours.count(t)]
        if added:
            return (f"Tool name(s) {added} were added: name exactly the tools of the original, in its order, "
                    "each as often as the original does.")
        return f"The tool names must be {ours} in this order, got {theirs}."
    return None


def check_variant(original: str, text: str, perturbation: str, reference: Workflow | None = None,
                  registry: ToolRegistry | None = None) -> None:
    """Raise VariantError unless ``text`` is a valid ``perturbation`` of ``original``: non-empty,
    different, every protected span of the original present byte-for-byte and in order, the same tool
    mentions in the same order (none added or dropped); a paraphrase within 20% of the original's
    length and, when both texts have a step list (``find_step_list``), as many steps as the original
    (v1 descriptions name no tool, so this is what keeps a paraphrase's steps); a requirement variant longer than the original and with any step cap ("at most N steps")
    no lower than the reference workflow's length."""
    check_type(perturbation)
    registry = registry or default_registry()
    if not text.strip():
        raise VariantError("The rewritten instruction is empty.")
    if text.strip() == original.strip():
        raise VariantError("The rewritten instruction is identical to the original; change its form.")
    problem = literal_problem(original, text, registry)
    if problem:
        raise VariantError(problem)
    if perturbation == "paraphrase":
        expected, got = step_count(original), step_count(text)
        if expected is not None and got is not None and got != expected:
            raise VariantError(f"The rewrite lists {got} steps; the original has {expected}: keep every step, "
                               "add none, merge none.")
        ratio = len(text) / max(1, len(original))
        if abs(ratio - 1) > LENGTH_TOLERANCE:
            raise VariantError(f"The paraphrase has {len(text)} characters, {ratio:.0%} of the original's "
                               f"{len(original)}: keep it within {LENGTH_TOLERANCE:.0%} of the original length.")
    if perturbation == "requirements":
        if len(text.strip()) <= len(original.strip()):
            raise VariantError("No requirement was added: keep the original instruction and add constraints.")
        if reference is not None:
            for m in _STEP_CAP.finditer(text):
                if int(m.group(1)) < len(reference.nodes):
                    raise VariantError(f"The cap {m.group(0)!r} makes the task infeasible: a correct workflow "
                                       f"needs {len(reference.nodes)} steps, so allow at least that many.")


# --- noise --------------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
# Word-level substitutes: the single-word entries of the rewording bank.
NOISE_SYNONYMS: dict[str, tuple[str, ...]] = {
    k: alts for k, v in SYNONYMS.items() if k.isalpha() and (alts := tuple(a for a in v if a.isalpha()))}
INSERT_WORDS: tuple[str, ...] = tuple(sorted({w for k, v in NOISE_SYNONYMS.items() for w in (k, *v)}))
NOISE_OPS = ("substitute", "insert", "swap", "delete")


def noise_rate(level: str, rng: np.random.Generator) -> float:
    """rho for a noise level, uniform in its range (rounded to 4 places so it prints and stores exactly)."""
    if level not in NOISE_RATES:
        raise ValueError(f"noise level must be one of {', '.join(NOISE_RATES)}, got {level!r}")
    lo, hi = NOISE_RATES[level]
    return round(float(rng.uniform(lo, hi)), 4)


def unprotected_words(text: str, registry: ToolRegistry | None = None) -> list[re.Match[str]]:
    """The words noise may touch: alphabetic words outside every protected span."""
    spans = protected_spans(text, registry)
    return [m for m in _WORD.finditer(text) if not _overlaps(m.start(), m.end(), spans)]


def _cased(word: str, like: str) -> str:
    return word[0].upper() + word[1:] if like[:1].isupper() else word


def _join(gaps: Sequence[str], words: Sequence[str | None]) -> str:
    """Rebuild a text from the gaps around its words; a deleted word (None) takes one space with it."""
    out = gaps[0]
    for word, gap in zip(words, gaps[1:], strict=True):
        if word is not None:
            out += word + gap
            continue
        if (not out or out[-1].isspace()) and gap[:1].isspace():
            gap = gap.lstrip()
        elif out[-1:].isspace() and (not gap or gap[0] in _TRAILING):
            out = out.rstrip()
        out += gap
    return out


def inject_noise(text: str, rate: float, rng: np.random.Generator, registry: ToolRegistry | None = None
                 ) -> tuple[str, list[dict[str, Any]]]:
    """Touch k = round(rate * n) of the n unprotected words, visited in random order, each by one
    operation drawn uniformly from those that apply: substitute (a bank synonym), insert (a bank word
    after it), swap (with the next word, when only a space separates them; touches both) or delete.
    Returns the text and the operations applied (``index``: the word's position among the n)."""
    if not 0 <= rate <= 1:
        raise ValueError(f"noise rate must be in [0, 1], got {rate!r}")
    matches = unprotected_words(text, registry)
    n = len(matches)
    gaps = [text[:matches[0].start()] if matches else text]
    gaps += [text[m.end():(matches[i + 1].start() if i + 1 < n else len(text))] for i, m in enumerate(matches)]
    words: list[str | None] = [m.group(0) for m in matches]
    budget = int(np.floor(rate * n + 0.5))
    touched = [False] * n
    ops: list[dict[str, Any]] = []
    for i in (int(j) for j in rng.permutation(n)):
        if budget <= 0:
            break
        if touched[i]:
            continue
        word = words[i]
        assert word is not None
        choices = ["insert", "delete"]
        if word.lower() in NOISE_SYNONYMS:
            choices.append("substitute")
        if budget >= 2 and i + 1 < n and not touched[i + 1] and gaps[i + 1].isspace():
            choices.append("swap")
        op = sorted(choices, key=NOISE_OPS.index)[int(rng.integers(len(choices)))]
        record: dict[str, Any] = {"op": op, "index": i, "word": word}
        if op == "substitute":
            alts = NOISE_SYNONYMS[word.lower()]
            words[i] = _cased(alts[int(rng.integers(len(alts)))], word)
            record["to"] = words[i]
        elif op == "insert":
            record["inserted"] = INSERT_WORDS[int(rng.integers(len(INSERT_WORDS)))]
            words[i] = f"{word} {record['inserted']}"
        elif op == "swap":
            words[i], words[i + 1] = words[i + 1], word
            record["with"] = words[i]
            touched[i + 1] = True
            budget -= 1
        else:
            words[i] = None
        touched[i] = True
        budget -= 1
        ops.append(record)
    return _join(gaps, words), ops


# --- step lists of world v1 descriptions --------------------------------------------------------------

# World v1 writes a task's steps in one of three styles (``core.tasks.generator_v1``): sentences opened by
# connectives ("First, ... Then ... Finally, ..."), one sentence "The job must a; then b; and finally c."
# or a numbered list under a header. The banks below hold the generator's wordings and more; a
# paraphrase may re-render a step list in another style or with other connectives, and the parser reads
# all of them, so that ``check_variant`` can compare step counts.
FIRST_WORDS = (*phrases.FIRST_WORDS, "To start,", "First of all,")
MIDDLE_WORDS = (*phrases.SENTENCE_CONNECTORS, "Afterwards,", "Subsequently,", "Following that,")
LAST_WORDS = (*phrases.LAST_WORDS, "Lastly,", "As a last step,")
MUST_LEADS = ("The job must", "The job has to", "The job needs to", "The work must")
MUST_LINKS = ("then", "next", "after that")
MUST_ENDS = ("and finally", "and lastly", "and last of all")
LIST_HEADERS = ("Steps:", "Do the following:", "The steps, in order:", "Work through these steps:")
STYLES = ("sentences", "must", "numbered")


def _alternation(words: Sequence[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_SENTENCE = r"(?P<word>{})\s+(?P<clause>[^\n]+?)\.(?=\s|$)"
_FIRST = re.compile(r"(?:^|(?<=[.:]\s))" + _SENTENCE.format(_alternation(FIRST_WORDS)))
_NEXT = re.compile(r"\s+" + _SENTENCE.format(_alternation(MIDDLE_WORDS + LAST_WORDS)))
_MUST = re.compile(r"(?:^|(?<=\s))The (?:job|work) (?:must|has to|needs to|should|is required to) "
                   r"(?P<body>[^\n]+?)\.(?=\s|$)")
_MUST_SPLIT = re.compile(r"; (?:" + _alternation(MUST_ENDS) + "|" + _alternation(MUST_LINKS) + r") ")
_NUMBERED = re.compile(r"(?:^|(?<=\s))(?:" + _alternation(LIST_HEADERS) + r")(?P<items>(?:\n\d+\. [^\n]*\.)+)(?=\n|$)")
_ITEM = re.compile(r"\n\d+\. ([^\n]*)\.")


@dataclass(frozen=True)
class StepList:
    """The step list found in a description: its span, style and clauses (lower-case first letter, no
    full stop)."""

    start: int
    end: int
    style: str
    clauses: tuple[str, ...]


def _lower_first(clause: str) -> str:
    return clause[:1].lower() + clause[1:] if clause[:2] != clause[:2].upper() else clause


def find_step_list(text: str) -> StepList | None:
    """The step list of a v1-style description in any of the three styles, or None (a v0 description,
    a single step, free text)."""
    m = _NUMBERED.search(text)
    if m:
        return StepList(m.start(), m.end(), "numbered",
                        tuple(_lower_first(c) for c in _ITEM.findall(m.group("items"))))
    m = _MUST.search(text)
    if m and _MUST_SPLIT.search(m.group("body")):
        return StepList(m.start(), m.end(), "must", tuple(_MUST_SPLIT.split(m.group("body"))))
    for first in _FIRST.finditer(text):
        clauses, end = [first.group("clause")], first.end()
        while (m := _NEXT.match(text, end)) is not None:
            clauses.append(m.group("clause"))
            end = m.end()
            if m.group("word") in LAST_WORDS:
                return StepList(first.start(), end, "sentences", tuple(clauses))
    return None


def step_count(text: str) -> int | None:
    """How many steps the description's step list has (semicolon-joined steps inside one item count
    apart), or None when it has no recognisable step list."""
    steps = find_step_list(text)
    if steps is None:
        return None
    return sum(len(_MUST_SPLIT.split(c)) for c in steps.clauses)


def _pick(options: Sequence[str], rng: np.random.Generator) -> str:
    return options[int(rng.integers(len(options)))]


def render_steps(clauses: Sequence[str], style: str, rng: np.random.Generator) -> str:
    """Clauses written as a step list of ``style`` with connectives drawn from the banks."""
    if style == "numbered":
        return _pick(LIST_HEADERS, rng) + "".join(f"\n{i}. {c[:1].upper()}{c[1:]}." for i, c in enumerate(clauses, 1))
    if style == "must":
        links = [f"; {_pick(MUST_LINKS, rng)} {c}" for c in clauses[1:-1]]
        return (f"{_pick(MUST_LEADS, rng)} {clauses[0]}{''.join(links)}; {_pick(MUST_ENDS, rng)} {clauses[-1]}.")
    words = [_pick(FIRST_WORDS, rng), *(_pick(MIDDLE_WORDS, rng) for _ in clauses[1:-1]), _pick(LAST_WORDS, rng)]
    return " ".join(f"{w} {c}." for w, c in zip(words, clauses, strict=True))


def _replace_steps(text: str, steps: StepList, style: str, clauses: Sequence[str], rng: np.random.Generator) -> str:
    """``text`` with its step list rendered anew; a numbered list stands on its own lines."""
    before, after = text[:steps.start].rstrip(), text[steps.end:].lstrip()
    sep = "\n" if style == "numbered" else " "
    body = render_steps(clauses, style, rng)
    return (before + sep if before else "") + body + (sep + after if after else "")


@cache
def _clause_bank() -> tuple[tuple[str, int, re.Pattern[str], frozenset[str]], ...]:
    """Every step clause of the v1 phrase bank as (tool, template index, pattern, slots)."""
    bank = []
    for tool, templates in phrases.STEP_CLAUSES.items():
        for i, template in enumerate(templates):
            pattern, slots = "", []
            for literal, slot in re.findall(r"([^{]*)(?:\{(\w+)\})?", template):
                pattern += re.escape(literal)
                if slot:
                    pattern += f"(?P={slot})" if slot in slots else f"(?P<{slot}>.+?)"
                    slots.append(slot)
            bank.append((tool, i, re.compile(pattern), frozenset(slots)))
    return tuple(bank)


def reword_clause(clause: str, rng: np.random.Generator, registry: ToolRegistry,
                  clauses: Mapping[str, Sequence[int]] | None = None) -> str:
    """Another wording of one step: a different clause of the phrase bank for the same step with the same
    slots, filled with the same values (when the clause is a bank clause of exactly one tool, and among
    the tool's ``clauses`` indices when given: a task held out by wording), else the clause with bank
    synonyms outside its protected spans."""
    matches = [(tool, i, m.groupdict(), slots) for tool, i, pattern, slots in _clause_bank()
               if (m := pattern.fullmatch(clause))]
    if len({tool for tool, *_ in matches}) == 1:
        tool, index, values, slots = matches[0]
        options = [t for j, t in enumerate(phrases.STEP_CLAUSES[tool])
                   if j != index and set(re.findall(r"\{(\w+)\}", t)) == slots
                   and (clauses is None or j in clauses.get(tool, ()))]
        if options:
            return _pick(options, rng).format(**values)
    spans = protected_spans(clause, registry)
    out, position = "", 0
    for a, b in [*spans, (len(clause), len(clause))]:
        out += reword(clause[position:a], rng) + clause[a:b]
        position = b
    return out


# --- paraphrase rules ---------------------------------------------------------------------------------

_CONNECTORS = ("then", "after that", "next", "and then", "afterwards")
_SPLITS = ("Then", "Next", "After that", "Afterwards")
_MODALS = ("has to", "needs to", "should", "is required to")
_DECLARATIVE_OPENINGS = ("The task is to {}", "You are asked to {}", "Please {}", "Your job is to {}",
                         "What is needed: {}")
_TOOL_FORMS = ("{phrase} with {tool}", "{phrase} using {tool}", "{phrase} via {tool}", "use {tool} to {phrase}",
               "have {tool} {phrase}", "{reworded} with {tool}", "{reworded} using {tool}")
# Declarative openings of the task library and imperative rewrites of them ({} is the captured text).
_OPENINGS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (re.compile(r"^This task (retrieve)s "), ("Retrieve ", "Please retrieve ", "The job is to retrieve ")),
    (re.compile(r"^Starting from (the .+?), "), ("Begin with {}: ", "Take {} as the starting point: ",
                                                  "With {} as input, ")),
    (re.compile(r"^A short job on (.+?): "), ("Here is a short job on {}: ", "This short job works on {}: ")),
    (re.compile(r"^The (\w+) team needs "), ("The {} team requires ", "What the {} team needs is ")),
    (re.compile(r"^The (\w+) team wants "), ("The {} team would like ", "What the {} team wants is ")),
    (re.compile(r"^We need "), ("What is needed is ", "There is a need for ")),
    (re.compile(r"^A small job on "), ("Here is a small job on ", "This is a small job on ")),
    (re.compile(r"^One small change is needed\. "), ("A small change is required. ", "Only one change is needed. ")),
)


@cache
def _imperative_verbs() -> frozenset[str]:
    """Verbs that open an imperative instruction: the first words of the operation phrases and of the
    task library's templates."""
    verbs = {p.split()[0] for p in OPERATION_PHRASES.values()}
    return frozenset(verbs | {"load", "run", "build", "integrate", "exchange", "synchronise", "synchronize",
                              "perform", "compute", "use", "create", "make", "process", "clean", "handle",
                              "prepare", "put", "connect", "produce", "turn", "carry"})


@cache
def _step_pattern(registry: ToolRegistry) -> re.Pattern[str]:
    phrases = sorted(set(OPERATION_PHRASES.values()), key=len, reverse=True)
    return re.compile(r"(?P<phrase>" + "|".join(re.escape(p) for p in phrases) + r") with "
                      + _tool_regex(registry, group="?P<tool>"))


def _steps(text: str, rng: np.random.Generator, registry: ToolRegistry,
           clauses: Mapping[str, Sequence[int]] | None = None) -> str:
    """Reword the steps: v0 steps ("<phrase> with <tool>") change how they name their tool (voice), some
    with reworded operation phrases; v1 steps (a step list, else each sentence) get about half of their
    clauses reworded (``reword_clause``, within ``clauses``)."""

    def step(m: re.Match[str]) -> str:
        form = _TOOL_FORMS[int(rng.integers(len(_TOOL_FORMS)))]
        reworded = paraphrase(m.group("phrase"), rng) if "{reworded}" in form else ""
        return form.format(phrase=m.group("phrase"), tool=m.group("tool"), reworded=reworded)

    text = _step_pattern(registry).sub(step, text)
    steps = find_step_list(text)
    if steps is not None:
        new = [reword_clause(c, rng, registry, clauses) if rng.random() < 0.5 else c for c in steps.clauses]
        if new != list(steps.clauses):
            return _replace_steps(text, steps, steps.style, new, rng) if steps.style != "sentences" else (
                text[:steps.start] + _reword_sentences(text[steps.start:steps.end], steps, new) + text[steps.end:])
        return text

    def sentence(m: re.Match[str]) -> str:
        clause = _lower_first(m.group(2))
        if not any(p.fullmatch(clause) for *_, p, _ in _clause_bank()):
            return m.group(0)
        new = reword_clause(clause, rng, registry, clauses)
        return m.group(1) + (new[:1].upper() + new[1:] if m.group(2)[:1].isupper() else new) + "."

    return re.sub(r"(^|(?<=\s))((?:[^\n.]|\.(?!\s|$))*?[^\n\s.])\.(?=\s|$)", sentence, text)


def _reword_sentences(block: str, steps: StepList, clauses: Sequence[str]) -> str:
    """A sentence-style step list with its clauses replaced in place (connectives kept)."""
    for old, new in zip(steps.clauses, clauses, strict=True):
        block = block.replace(f" {old}.", f" {new}.", 1)
    return block


def _connectors(text: str, rng: np.random.Generator, registry: ToolRegistry) -> str:
    """Other connectors between steps: v0's ", then " and the connectives of a v1 step list."""
    text = re.sub(r", then ", lambda _: f", {_CONNECTORS[int(rng.integers(len(_CONNECTORS)))]} ", text)
    steps = find_step_list(text)
    return text if steps is None else _replace_steps(text, steps, steps.style, steps.clauses, rng)


def _restyle(text: str, rng: np.random.Generator, registry: ToolRegistry) -> str:
    """A v1 step list written in another of the three styles (sentences, one "must" sentence, a list)."""
    steps = find_step_list(text)
    if steps is None:
        return text
    style = _pick([s for s in STYLES if s != steps.style], rng)
    return _replace_steps(text, steps, style, steps.clauses, rng)


def _split(text: str, rng: np.random.Generator, registry: ToolRegistry) -> str:
    """Split a list of steps into sentences at some of its ", then " connectors."""
    return re.sub(r", then ", lambda _: (f". {_SPLITS[int(rng.integers(len(_SPLITS)))]}, " if rng.random() < 0.4
                                         else ", then "), text)


def _merge(text: str, rng: np.random.Generator, registry: ToolRegistry) -> str:
    """Join sentences with a semicolon (when the next one opens with an ordinary word)."""
    spans = protected_spans(text, registry)

    def merge(m: re.Match[str]) -> str:
        if _overlaps(m.start(1), m.end(1), spans):
            return m.group(0)
        return "; " + m.group(1).lower() + " "

    return re.sub(r"(?<=[^\W\d])\. ([A-Z][a-z]+) ", merge, text)


def _modal(text: str, rng: np.random.Generator, registry: ToolRegistry) -> str:
    return re.sub(r"\bmust\b", lambda _: _MODALS[int(rng.integers(len(_MODALS)))], text)


def _opening(text: str, rng: np.random.Generator, registry: ToolRegistry) -> str:
    """Declarative openings become imperative and imperative ones declarative."""
    for pattern, rewrites in _OPENINGS:
        m = pattern.match(text)
        if m:
            rewrite = rewrites[int(rng.integers(len(rewrites)))]
            return rewrite.format(*m.groups()) + text[m.end():]
    first = re.match(r"[A-Z][a-z]+\b", text)
    if first and first.group(0).lower() in _imperative_verbs():
        frame = _DECLARATIVE_OPENINGS[int(rng.integers(len(_DECLARATIVE_OPENINGS)))]
        return frame.format(text[0].lower() + text[1:])
    return text


# Applied in this order; each candidate applies a random non-empty subset.
PARAPHRASE_RULES: tuple[tuple[str, Callable[[str, np.random.Generator, ToolRegistry], str]], ...] = (
    ("opening", _opening), ("restyle", _restyle), ("connectors", _connectors), ("steps", _steps),
    ("modal", _modal), ("merge", _merge), ("split", _split))
PARAPHRASE_CANDIDATES = 12
FALLBACK_FRAME = "The task is as follows: {}"


def paraphrase_instruction(text: str, rng: np.random.Generator, registry: ToolRegistry | None = None,
                           clauses: Mapping[str, Sequence[int]] | None = None) -> tuple[str, list[str]]:
    """A rule-based paraphrase of ``text`` and the names of the rules used: the first of up to
    ``PARAPHRASE_CANDIDATES`` random rule combinations that passes ``check_variant`` (length within 20%
    included), else the valid one closest in length, else the text behind a fixed declarative frame.
    ``clauses``: per tool, the bank clauses a reworded step may take (a task held out by wording)."""
    registry = registry or default_registry()
    rules = [(name, functools.partial(_steps, clauses=clauses) if rule is _steps else rule)
             for name, rule in PARAPHRASE_RULES]
    best: tuple[float, str, list[str]] | None = None
    for _ in range(PARAPHRASE_CANDIDATES):
        chosen = [(name, rule) for name, rule in rules if rng.random() < 0.6]
        if not chosen:
            chosen = [rules[int(rng.integers(len(rules)))]]
        candidate = text
        applied = []
        for name, rule in chosen:
            rewritten = rule(candidate, rng, registry)
            if rewritten != candidate:
                candidate = rewritten
                applied.append(name)
        try:
            check_variant(text, candidate, "paraphrase", registry=registry)
            return candidate, applied
        except VariantError:
            deviation = abs(len(candidate) / max(1, len(text)) - 1)
            if candidate.strip() != text.strip() and literal_problem(text, candidate, registry) is None and (
                    best is None or deviation < best[0]):
                best = (deviation, candidate, applied)
    if best is not None:
        return best[1], best[2]
    return FALLBACK_FRAME.format(text), ["frame"]


# --- requirement augmentation -------------------------------------------------------------------------

# Each requirement kind with its wordings ({} is its value); values come from the task and its
# reference workflow so that the reference satisfies every requirement.
REQUIREMENT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "step_cap": ("Use no more than {} steps in the workflow.", "The workflow may contain at most {} steps.",
                 "Keep the plan to at most {} steps."),
    "retry_cap": ("Retry a failed tool call at most {} times.", "Do not retry a failing tool more than {} times."),
    "time_limit": ("Finish the whole run within {} seconds.", "The job must complete in under {} seconds."),
    "output_format": ("Deliver the final result in {} format.", "The output must be written as {}."),
    "batch_size": ("Process the input in batches of {} records.",),
    "encoding": ("Treat the input as {} text.",),
    "tools_only": ("Use only the tools that the steps above need and the tools they depend on.",
                   "Do not call tools beyond those the steps above require and their prerequisites."),
    "order": ("Carry out the steps in the order given.", "Keep the order of the steps as listed."),
    "report": ("If a step cannot be completed, say which one and stop.",),
}
REQUIREMENT_LEADS = ("", "Requirements: ", "Constraints: ", "In addition: ")


def requirement_values(task: Task, reference: Workflow, rng: np.random.Generator) -> dict[str, Any]:
    """The requirement kinds that apply to ``task`` with their values (None: no value)."""
    values: dict[str, Any] = {"step_cap": len(reference.nodes) + int(rng.integers(0, 3)),
                              "retry_cap": task.max_retries}
    if isinstance(task.constraints.get("timeout"), int | float):
        values["time_limit"] = task.constraints["timeout"]
    fmt = (task.expected_outputs.get("metadata") or {}).get("output_format")
    if isinstance(fmt, str) and fmt.isalnum():
        values["output_format"] = fmt.upper()
    options = task.inputs.get("options") or {}
    if isinstance(options.get("batch_size"), int):
        values["batch_size"] = options["batch_size"]
    if isinstance(options.get("encoding"), str) and re.fullmatch(r"[\w-]+", options["encoding"]):
        values["encoding"] = options["encoding"]
    return values | {"tools_only": None, "order": None, "report": None}


def augment_requirements(task: Task, reference: Workflow, rng: np.random.Generator
                         ) -> tuple[str, list[dict[str, Any]]]:
    """The task's description followed by 2-4 requirements drawn from the bank (in bank order), and the
    requirements as {"kind", "value", "text"}."""
    values = requirement_values(task, reference, rng)
    kinds = [k for k in REQUIREMENT_TEMPLATES if k in values]
    count = int(rng.integers(2, min(4, len(kinds)) + 1))
    chosen = sorted(int(i) for i in rng.choice(len(kinds), size=count, replace=False))
    added = []
    for i in chosen:
        kind = kinds[i]
        templates = REQUIREMENT_TEMPLATES[kind]
        added.append({"kind": kind, "value": values[kind],
                      "text": templates[int(rng.integers(len(templates)))].format(values[kind])})
    lead = REQUIREMENT_LEADS[int(rng.integers(len(REQUIREMENT_LEADS)))]
    base = task.description.rstrip()
    if base and base[-1] not in ".!?":
        base += "."
    return f"{base} {lead}{' '.join(r['text'] for r in added)}", added


# --- rules, per variant -------------------------------------------------------------------------------


def rule_variant(task: Task, reference: Workflow, perturbation: str, rng: np.random.Generator, index: int = 0,
                 registry: ToolRegistry | None = None) -> Variant:
    """The offline variant ``perturbation``-``index`` of ``task`` drawn from ``rng``."""
    check_type(perturbation)
    variant_id = f"{perturbation}-{index}"
    if perturbation == "paraphrase":
        clauses = (task.metadata.get("wording") or {}).get("clauses")
        text, rules = paraphrase_instruction(task.description, rng, registry, clauses)
        return Variant(variant_id, perturbation, text, None, "rules", {"rules": rules})
    if perturbation == "requirements":
        text, added = augment_requirements(task, reference, rng)
        return Variant(variant_id, perturbation, text, None, "rules", {"requirements": added})
    rate = noise_rate(perturbation, rng)
    text, ops = inject_noise(task.description, rate, rng, registry)
    return Variant(variant_id, perturbation, text, rate, "rules",
                   {"ops": ops, "words": len(unprotected_words(task.description, registry))})


# --- LLM perturbations --------------------------------------------------------------------------------

_KEEP = ("Copy byte-for-byte, in their original order: every tool name (words joined by underscores, such as "
         "file_operations_reader), file path, URL, identifier, number, upper-case format name and quoted "
         "literal. Name no tool that the instruction does not name.")
_FORMAT = "Reply with the rewritten instruction between <answer> and </answer>, and nothing else."
SYSTEM_PROMPTS = {
    "paraphrase": (
        "You rewrite instructions for a system that turns them into tool workflows. Change the form only: "
        "active or passive voice, imperative or declarative mood, sentence structure, the connectors between "
        "steps, near-synonyms of ordinary words. Keep the meaning, the order of the steps, the language and "
        "every requirement: add none, drop none, make none stricter or looser. Keep the length within 20% of "
        f"the original. {_KEEP} {_FORMAT}"),
    "requirements": (
        "You tighten instructions for a system that turns them into tool workflows. Keep the original "
        "instruction word for word at the start and append two to four short constraints that a correct "
        "solution still meets, for example a cap on the number of steps (never below the number of steps the "
        "solution needs), a cap on retries, a time limit, the output format, or using only the tools the steps "
        "need and their prerequisites. Nothing may contradict the instruction or change the order of its steps. "
        f"{_KEEP} {_FORMAT}"),
}


def llm_messages(task: Task, reference: Workflow, perturbation: str, registry: ToolRegistry | None = None
                 ) -> list[Message]:
    """The first conversation asking for one ``perturbation`` (paraphrase or requirements) of ``task``."""
    if perturbation not in LLM_TYPES:
        raise ValueError(f"LLM perturbations are {', '.join(LLM_TYPES)}, got {perturbation!r}")
    literals = protected_texts(task.description, registry)
    user = f"Instruction:\n{task.description}\n\nLiterals to keep exactly, in this order: " + (
        " | ".join(literals) if literals else "(none)")
    if perturbation == "requirements":
        facts = [f"a correct workflow has {len(reference.nodes)} steps "
                 f"({', '.join(n.label for n in reference.nodes)})", f"each tool may be retried {task.max_retries} times"]
        if "timeout" in task.constraints:
            facts.append(f"the time limit is {task.constraints['timeout']} seconds")
        user += "\nFacts for feasible constraints: " + "; ".join(facts) + "."
    return [{"role": "system", "content": SYSTEM_PROMPTS[perturbation]}, {"role": "user", "content": user}]


def extract_answer(text: str) -> str:
    """The text between the first <answer> and </answer>, stripped; VariantError otherwise."""
    try:
        return answer_block(text)
    except ValueError as exc:
        raise VariantError(f"{exc} {_FORMAT}") from None


@dataclass(frozen=True)
class InstructionRequest:
    """One LLM variant to produce: ``rng`` is the variant's own generator (``variant_rng``), used by the
    rule fallback."""

    task: Task
    reference: Workflow
    perturbation: str
    index: int
    rng: np.random.Generator


@dataclass
class InstructionPerturber:
    """Paraphrase and requirement variants through an LLM ``Backend`` (module docstring).

    ``attempts``: answers asked for per variant before the rules take over (>= 1). ``generation``:
    sampling settings (greedy by default, so a deterministic backend gives reproducible variants)."""

    backend: Backend
    attempts: int = 3
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=512, seed=0))
    registry: ToolRegistry = field(default_factory=default_registry)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")

    @property
    def settings(self) -> dict[str, Any]:
        """What determines the variants (for dataset metadata)."""
        return {"backend": getattr(self.backend, "name", type(self.backend).__name__), "attempts": self.attempts,
                "max_new_tokens": self.generation.max_new_tokens, "temperature": self.generation.temperature,
                "top_p": self.generation.top_p, "seed": self.generation.seed}

    def perturb(self, requests: Sequence[InstructionRequest]) -> list[Variant]:
        """One variant per request, in order; all pending requests go to the backend in one call per
        round. A variant with no valid answer after ``attempts`` (or when the backend fails) comes from
        the rules, with ``notes["fallback_reason"]``."""
        for r in requests:
            if r.perturbation not in LLM_TYPES:
                raise ValueError(f"LLM perturbations are {', '.join(LLM_TYPES)}, got {r.perturbation!r}")
        conversations = [llm_messages(r.task, r.reference, r.perturbation, self.registry) for r in requests]

        def validate(i: int, answer: str) -> str:
            r = requests[i]
            text = extract_answer(answer)
            check_variant(r.task.description, text, r.perturbation, r.reference, self.registry)
            return text

        answers = ask_until_valid(self.backend, conversations, validate, self.attempts, self.generation)
        results: list[Variant] = []
        for r, got in zip(requests, answers, strict=True):
            if got.value is not None:
                results.append(Variant(f"{r.perturbation}-{r.index}", r.perturbation, got.value, None, "llm",
                                       {"attempts": got.attempts, "errors": got.errors}))
                continue
            fallback = rule_variant(r.task, r.reference, r.perturbation, r.rng, r.index, self.registry)
            reason = got.failure or f"no valid answer in {self.attempts} attempt(s); last: {got.errors[-1]}"
            results.append(Variant(fallback.variant_id, fallback.perturbation, fallback.text, fallback.rate, "rules",
                                   {**fallback.notes, "fallback_reason": reason, "errors": got.errors}))
        return results
