"""Flawed prompts look like optimal ones: only the plan's content differs, never its form.

(a) Every field of a flawed prompt takes its values from the set the optimal prompts use, once content is
abstracted away; (b) a logistic regression and a decision stump over surface features cannot tell flawed
from optimal prompts on held-out tasks (accuracy below 0.6), while the same classifiers spot a planted
tell.

Content, not form, and so left out of both checks (docs/core/prompts.md, "Flawed prompts"): which tools the
plan calls and what follows from the tool alone (its purpose text, expected value, alternatives, whether
the step carries arguments and which), the number of steps (missing_step removes steps, redundant and
unrelated_insertion add them), each step's prerequisites, and the JSON type of an argument (parameter
flaws give a value of the wrong type). The classifier features are rates per step, never totals, so that
the step count does not enter them through the back door.
"""

import json
import re
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest

from resilibench.core.arguments import task_hints, valid_arguments
from resilibench.core.registry import OPERATION_PHRASES, RETURN_VALUES, default_registry
from resilibench.core.text.flaws import FLAW_TYPES, FlawNotApplicable
from resilibench.core.text.prompts import PLAN_HEADING, PLAN_STYLES, ROLE_STEPS, PromptSettings, build_prompt
from resilibench.core.world import load_tasks

REGISTRY = default_registry()
N_TASKS = 150
SEVERITIES = (0.2, 0.5, 1.0)
CHANCE_LIMIT = 0.6


def _sample():
    """A seeded sample of the library, whatever ``load_tasks`` ships (v0 or v1)."""
    tasks = load_tasks(split=None)
    picks = np.random.default_rng(11).choice(len(tasks), size=min(N_TASKS, len(tasks)), replace=False)
    return [tasks[i] for i in sorted(picks)]


TASKS = _sample()


def _flawed(task, style, index, flaw_type):
    """A flawed prompt for ``task``, or None when the flaw type has nothing to change in its plan."""
    try:
        settings = PromptSettings(variant="flawed", flaw_type=flaw_type, severity=SEVERITIES[index % 3],
                                  plan_style=style, matcher="lexical")
        return build_prompt(task, settings, seed=index)
    except FlawNotApplicable:
        return None


def build_prompts():
    """style -> (optimal prompts, flawed prompts of every type), each with its task."""
    out = {}
    for style in PLAN_STYLES:
        settings = PromptSettings(variant="optimal", plan_style=style, matcher="lexical")
        optimal = [(t, build_prompt(t, settings)) for t in TASKS]
        flawed = [(t, p) for i, t in enumerate(TASKS) for flaw in FLAW_TYPES
                  if (p := _flawed(t, style, i, flaw)) is not None]
        out[style] = optimal, flawed
    return out


@pytest.fixture(scope="module")
def prompts():
    return build_prompts()


# --- (a) every field's value set -----------------------------------------------------------------------------

_TOOLS = sorted(REGISTRY.names, key=len, reverse=True)
_PHRASES = sorted(OPERATION_PHRASES.values(), key=len, reverse=True)
_EXPECTED = {f"{name} ({description.lower()})" for name, _, description in RETURN_VALUES.values()}
_MCP_STEP = re.compile(r"^(\d+)\. (?:Execute (\w+)|Step)$")
_MCP_FIELD = re.compile(r"^   - (\w+): (.*)$")
_NUMBERED_STEP = re.compile(r"^(\d+)\. (\w+): (.*?)(?: args=(\{.*\}))?(?: \(after ([\d, ]+)\))?$")


def _form(text: str) -> str:
    """``text`` with its content abstracted: tool names, operation phrases and names, expected values,
    step numbers, and lists of them collapsed to one item."""
    if text in _EXPECTED:
        return "<expected>"
    for name in _TOOLS:
        text = text.replace(name, "<tool>")
    for phrase in _PHRASES:
        text = text.replace(phrase, "<phrase>")
    text = re.sub(r"the \w+ operation", "the <op> operation", text)
    text = re.sub(r"^(?:" + "|".join(r.capitalize() for r in ROLE_STEPS.values()) + ") step;", "<role> step;", text)
    text = re.sub(r"\bstep \d+", "step <n>", text)
    text = re.sub(r"^\d+\.", "<n>.", text)
    text = re.sub(r"\d+(, \d+)*\)", "<n>)", text)
    return re.sub(r"(, step <n> \(<tool>\))+", "", re.sub(r"<tool>(, <tool>)+", "<tool>", text))


def _split(text: str, style: str) -> tuple[list[str], list[str]]:
    """The plan's lines (steps and their fields) and every other line of the prompt."""
    if style == "mcp_task":
        head, rest = text.split("<execution_plan>\n", 1)
        plan, tail = rest.split("</execution_plan>", 1)
    else:
        head, rest = text.split(PLAN_HEADING + "\n\n", 1)
        plan, tail = rest.split("\n\n", 1)
    return plan.splitlines(), head.splitlines() + tail.splitlines()


def _steps(text: str, style: str) -> list[dict]:
    """The plan's steps: tool, fields by name (numbered: the line's form) and arguments (None: none)."""
    steps = []
    for line in _split(text, style)[0]:
        if style == "mcp_task":
            if m := _MCP_STEP.match(line):
                steps.append({"tool": m.group(2), "fields": {}, "arguments": None})
                continue
            name, value = _MCP_FIELD.match(line).groups()
            steps[-1]["fields"][name] = value
            if name == "Arguments":
                steps[-1]["arguments"] = json.loads(value)
            continue
        number, tool, phrase, arguments, after = _NUMBERED_STEP.match(line).groups()
        form = _form(f"{number}. {tool}: {phrase}") + (" args=<args>" if arguments else "") + (
            f" (after {after})" if after else "")
        steps.append({"tool": tool, "fields": {"line": _form(form)},
                      "arguments": json.loads(arguments) if arguments else None})
    return steps


def _argument_form(value, hints: dict) -> str:
    """An argument value as JSON, the task's own paths (unique to the task) named ``<source>``, ``<destination>``."""
    text = json.dumps(value, sort_keys=True)
    for name in ("source", "destination"):
        text = text.replace(json.dumps(hints[name]), f"<{name}>")
    return text


def _value_sets(pairs, style) -> dict[str, set]:
    """Field -> the forms it takes in ``pairs`` of (task, prompt). Left out as content: the step count
    line, tool-derived fields (checked by ``_check_tool_derived``) and arguments of the wrong JSON type
    (parameter flaws; their values are checked against every argument value in ``any argument``)."""
    values = defaultdict(set)
    for task, prompt in pairs:
        hints = task_hints(task)
        steps, others = _steps(prompt.text, style), _split(prompt.text, style)[1]
        values["other lines"] |= {line for line in others if not line.startswith("Steps: ")}
        for step in steps:
            fields = step["fields"]
            values["fields of a step"].add(tuple(f for f in fields if f != "Arguments"))
            for name, value in fields.items():
                if name not in ("Arguments", "Purpose", "Expected", "Alternatives"):
                    values[name].add(_form(value))
            spec = REGISTRY[step["tool"]]
            for name, value in (step["arguments"] or {}).items():
                form = _argument_form(value, hints)
                values["any argument"].add(form)
                if spec.check_arguments({**valid_arguments(spec), name: value}) is None:
                    values[f"argument {name}"].add(form)
    return values


def _check_tool_derived(pairs, style) -> None:
    """A step's tool-derived fields are what that tool gets in any plan: arguments present exactly when
    the tool takes a value from the task, the purpose an operation phrase, the expected value the tool's."""
    for task, prompt in pairs:
        for step in _steps(prompt.text, style):
            spec = REGISTRY[step["tool"]]
            assert (step["arguments"] is not None) == bool(valid_arguments(spec, task_hints(task))), step
            if style == "mcp_task":
                name, _, description = RETURN_VALUES[spec.operation]
                assert step["fields"]["Expected"] == f"{name} ({description.lower()})"
                assert step["fields"]["Purpose"] in OPERATION_PHRASES.values()
                assert len(step["fields"]["Alternatives"].split(", ")) == 2


@pytest.mark.parametrize("style", PLAN_STYLES)
def test_every_field_of_a_flawed_prompt_takes_values_optimal_prompts_take(prompts, style):
    optimal, flawed = prompts[style]
    assert len(flawed) > 4 * len(optimal)  # most flaw types apply to most plans
    _check_tool_derived(optimal + flawed, style)
    seen, shown = _value_sets(optimal, style), _value_sets(flawed, style)
    assert set(shown) <= set(seen)
    for field, values in shown.items():
        assert values <= seen[field], f"{field}: only in flawed prompts: {sorted(values - seen[field])[:5]}"


# --- (b) a trivial classifier -------------------------------------------------------------------------------

_PUNCTUATION = {"commas": ",", "colons": ":", "semicolons": ";", "quotes": '"', "braces": "{",
                "parentheses": "(", "periods": ".", "underscores": "_"}


def skeleton(text: str, style: str) -> list[str]:
    """The plan's lines with their content abstracted (``_form``): arguments as ``<args>`` and the
    plan's edges (prerequisites, dependents) as ``<edges>``, since which steps have some follows from
    the plan's graph and its step count (the first step never has prerequisites)."""
    lines = []
    for line in _split(text, style)[0]:
        line = re.sub(r"(args=|Arguments: )\{.*\}", r"\1<args>", line)
        if style == "numbered":
            line = re.sub(r" \(after [\d, ]+\)$", "", line) + " <edges>"
        line = re.sub(r"(?<=Requires: ).*|(?<=operation; ).*", "<edges>", line)
        lines.append(_form(line.split(": ", 1)[0]) + (": " + _form(line.split(": ", 1)[1]) if ": " in line else ""))
    return lines


def surface_features(text: str, style: str) -> dict[str, float]:
    """Surface features of a prompt's plan: lengths and punctuation of its form (``skeleton``), rates per
    step of lines and fields, and (mcp_task) the confidence statistics, the reasons' parts and the
    predicted success. Content-defined features are left out: the step count and everything that grows
    with it (totals, line breaks, which steps have prerequisites), and the arguments (whether a step has
    some follows from its tool; their number and length from the flaw or the steps the plan has)."""
    steps = _steps(text, style)
    n = max(1, len(steps))
    lines = skeleton(text, style)
    form = "".join(lines)
    chars = max(1, len(form))
    features = {
        "lines per step": len(lines) / n,
        "characters per step": len(form) / n,
        "mean line length": float(np.mean([len(line) for line in lines])),
        "longest line": float(max(len(line) for line in lines)),
        "digits per character": sum(c.isdigit() for c in form) / chars,
    }
    features |= {f"{name} per character": form.count(mark) / chars for name, mark in _PUNCTUATION.items()}
    if style == "mcp_task":
        confidences = [float(s["fields"]["Confidence"]) for s in steps if "Confidence" in s["fields"]]
        reasons = [_form(s["fields"].get("Reason", "")) for s in steps]
        features |= {
            "confidence mean": round(float(np.mean(confidences)), 4) if confidences else -1.0,
            "confidence min": min(confidences, default=-1.0),
            "confidence max": max(confidences, default=-1.0),
            "confidence range": max(confidences) - min(confidences) if confidences else -1.0,
            "distinct confidences": float(len(set(confidences))),
            "reason parts": float(np.mean([r.count(";") + 1 for r in reasons])),
            "predicted success": float(re.search(r"Predicted success probability: ([\d.]+)", text).group(1)),
        }
        for field in ("Purpose", "Reason", "Requires", "Alternatives", "Expected", "Confidence"):
            features[f"share of steps with {field}"] = sum(field in s["fields"] for s in steps) / n
    return features


def _logistic_regression(x_train, y_train, x_test, steps=2000, rate=0.1, l2=1e-3) -> np.ndarray:
    """Predictions of a logistic regression fitted by gradient descent on standardised features."""
    mean, std = x_train.mean(0), x_train.std(0) + 1e-9
    a, b = (x_train - mean) / std, (x_test - mean) / std
    w, bias = np.zeros(a.shape[1]), 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(a @ w + bias)))
        w -= rate * (a.T @ (p - y_train) / len(a) + l2 * w)
        bias -= rate * float(np.mean(p - y_train))
    return (b @ w + bias > 0).astype(float)


def _stump(x_train, y_train, x_test) -> np.ndarray:
    """Predictions of the best single-feature threshold rule on the training set."""
    best = (0.0, 0, 0.0, 1)
    for j in range(x_train.shape[1]):
        values = np.unique(x_train[:, j])
        for threshold in (values[:-1] + values[1:]) / 2 if len(values) > 1 else values:
            for sign in (1, -1):
                accuracy = float(np.mean((sign * (x_train[:, j] - threshold) > 0) == y_train))
                if accuracy > best[0]:
                    best = (accuracy, j, threshold, sign)
    _, j, threshold, sign = best
    return (sign * (x_test[:, j] - threshold) > 0).astype(float)


def held_out_accuracy(pairs, style, classifier, folds=5) -> float:
    """Accuracy of ``classifier`` on (task, prompt, is-flawed) triples, by cross-validation over tasks
    (the prompts of one task are never in training and test at once)."""
    rows = [surface_features(p.text, style) for _, p, _ in pairs]
    x = np.array([[row[k] for k in sorted(rows[0])] for row in rows])
    y = np.array([flawed for _, _, flawed in pairs], dtype=float)
    task_ids = sorted({t.instance_id for t, _, _ in pairs})
    fold = np.array([task_ids.index(t.instance_id) % folds for t, _, _ in pairs])
    correct = 0
    for k in range(folds):
        predictions = classifier(x[fold != k], y[fold != k], x[fold == k])
        correct += int(np.sum(predictions == y[fold == k]))
    return correct / len(pairs)


def _balanced(prompts, style):
    """Every task's optimal prompt and one flawed prompt of it (flaw types in turn): half of each."""
    optimal, flawed = prompts[style]
    by_task = defaultdict(list)
    for task, prompt in flawed:
        by_task[task.instance_id].append(prompt)
    pairs = []
    for i, (task, prompt) in enumerate(optimal):
        options = by_task[task.instance_id]
        if options:
            pairs += [(task, prompt, False), (task, options[i % len(options)], True)]
    return pairs


def _planted(pairs, style):
    """The same prompts with a tell planted in each flawed one: a lower confidence on the last step
    (mcp_task) or a step shown without its text (numbered)."""
    def plant(text):
        if style == "mcp_task":
            head, _, tail = text.rpartition("   - Confidence: ")
            return head + "   - Confidence: 0.40" + tail[4:]
        return re.sub(r"^(1\. \w+): [^{(]*?(?= args=| \(after|$)", r"\1:", text, count=1, flags=re.M)

    return [(t, replace(p, text=plant(p.text)) if flawed else p, flawed) for t, p, flawed in pairs]


@pytest.mark.parametrize("style", PLAN_STYLES)
@pytest.mark.parametrize("classifier", [_logistic_regression, _stump], ids=["logistic", "stump"])
def test_a_surface_classifier_cannot_tell_flawed_from_optimal(prompts, style, classifier):
    pairs = _balanced(prompts, style)
    assert len(pairs) >= 200
    accuracy = held_out_accuracy(pairs, style, classifier)
    assert accuracy < CHANCE_LIMIT, f"{style}: flawed prompts told apart by form with accuracy {accuracy:.3f}"
    assert held_out_accuracy(_planted(pairs, style), style, classifier) > 0.9  # it would see a tell


def report() -> None:
    """Print, per plan style, the forms only flawed prompts take, the held-out accuracy of both
    classifiers (overall and by flaw type) and each feature's mean over optimal and flawed prompts."""
    built = build_prompts()
    for style in PLAN_STYLES:
        optimal, flawed = built[style]
        seen, shown = _value_sets(optimal, style), _value_sets(flawed, style)
        print(f"{style}: {len(optimal)} optimal, {len(flawed)} flawed prompts of {len(TASKS)} tasks")
        for field in sorted(shown):
            extra = sorted(shown[field] - seen[field])
            print(f"  {field}: {len(seen[field])} forms in optimal prompts; only in flawed: {len(extra)} {extra[:4]}")
        pairs = _balanced(built, style)
        for classifier in (_logistic_regression, _stump):
            by_type = {flaw: held_out_accuracy([q for i in range(0, len(pairs), 2) for q in pairs[i:i + 2]
                                                if pairs[i + 1][1].injection.flaw_type == flaw], style, classifier)
                       for flaw in FLAW_TYPES}
            print(f"  {classifier.__name__.strip('_')}: {held_out_accuracy(pairs, style, classifier):.3f} held out; "
                  + ", ".join(f"{k} {v:.2f}" for k, v in by_type.items()))
        rows = [(surface_features(p.text, style), flawed) for _, p, flawed in pairs]
        for name in sorted(rows[0][0]):
            means = [np.mean([r[name] for r, f in rows if f == label]) for label in (False, True)]
            print(f"    {name}: optimal {means[0]:.4f}, flawed {means[1]:.4f}")


if __name__ == "__main__":
    report()
